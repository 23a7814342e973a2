#!/usr/bin/env bash
# recovery_controller_test.sh with the stages writing their files themselves on a path
# they share with the controller (--checkpoint_transport shared_path); the
# plain test sends them through the controller.
CHECKPOINT_TRANSPORT=shared_path exec bash "$(dirname "$0")/recovery_controller_test.sh" "$@"

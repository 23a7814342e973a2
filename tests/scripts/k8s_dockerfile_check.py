#!/usr/bin/env python3
"""Checks a Dockerfile for what can be checked without a container engine.

  k8s_dockerfile_check.py SOURCE_DIR DOCKERFILE...

For each Dockerfile (built with the repository root as its context):
  - every FROM names a stage or an image with a pinned tag (ARG defaults are
    resolved): no missing tag, no `latest`;
  - COPY/ADD sources of the context exist and are not excluded by the
    Dockerfile's own .dockerignore; COPY --from names an earlier stage;
  - the scripts RUN names (scripts/..., deploy/...) exist and are executable;
  - every `--target` built and every binary copied out of build/bin is an
    add_executable of the project's CMake files;
  - the last stage switches to a non-root USER, has an ENTRYPOINT or CMD,
    and the entrypoint it copies exists;
  - no `apt-get install` without --no-install-recommends, no `sudo`.
Standard library only; prints each problem and exits 1 if there are any.
"""

import fnmatch
import glob
import os
import re
import shlex
import sys

problems = []


def problem(where, message):
    problems.append("%s: %s" % (where, message))


def instructions(path):
    """(line number, INSTRUCTION, argument text) with continuations joined."""
    out, buf, start = [], "", 0
    with open(path) as f:
        for number, line in enumerate(f, 1):
            stripped = line.strip()
            if not buf and (not stripped or stripped.startswith("#")):
                continue
            if buf and stripped.startswith("#"):
                continue
            if not buf:
                start = number
            if stripped.endswith("\\"):
                buf += stripped[:-1] + " "
                continue
            buf += stripped
            word, _, rest = buf.partition(" ")
            out.append((start, word.upper(), rest.strip()))
            buf = ""
    return out


def executables(src):
    names = set()
    for cmake in glob.glob(os.path.join(src, "**", "CMakeLists.txt"),
                           recursive=True):
        if "/build" in cmake[len(src):]:
            continue
        with open(cmake) as f:
            names.update(re.findall(r"add_executable\(\s*([A-Za-z0-9_.+-]+)",
                                    f.read()))
    return names


def ignored_patterns(dockerfile):
    path = dockerfile + ".dockerignore"
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [l.strip().rstrip("/") for l in f
                if l.strip() and not l.startswith("#")]


def is_ignored(relpath, patterns):
    parts = relpath.strip("/").split("/")
    for pattern in patterns:
        for i in range(1, len(parts) + 1):
            prefix = "/".join(parts[:i])
            if fnmatch.fnmatch(prefix, pattern) or (
                    pattern.startswith("**/") and
                    fnmatch.fnmatch(parts[i - 1], pattern[3:])):
                return True
    return False


def check(src, dockerfile, binaries):
    where = os.path.relpath(dockerfile, src)
    args = {}
    stages = []
    users = {}
    entry = {}
    ignore = ignored_patterns(dockerfile)
    for number, word, rest in instructions(dockerfile):
        at = "%s:%d" % (where, number)
        if word == "ARG":
            name, eq, value = rest.partition("=")
            if eq:
                args[name.strip()] = value.strip().strip('"')
        elif word == "FROM":
            tokens = [t for t in rest.split() if not t.startswith("--")]
            image = re.sub(r"\$\{?(\w+)\}?", lambda m: args.get(m.group(1), ""),
                           tokens[0])
            if len(tokens) >= 3 and tokens[1].upper() == "AS":
                stage = tokens[2]
            else:
                stage = str(len(stages))
            if image not in stages:
                name = image.split("@")[0]
                tag = name.rsplit(":", 1)[1] if ":" in name.split("/")[-1] else ""
                if not image:
                    problem(at, "FROM %s: the ARG has no default" % tokens[0])
                elif not tag:
                    problem(at, "FROM %s: the image has no pinned tag" % image)
                elif tag == "latest" or tag.endswith("-latest"):
                    problem(at, "FROM %s: `latest` is not a pinned tag" % image)
            stages.append(stage)
        elif word in ("COPY", "ADD"):
            if word == "ADD":
                problem(at, "ADD: use COPY (ADD fetches URLs and unpacks)")
            flags = re.findall(r"--(\w+)=(\S+)", rest)
            tokens = [t for t in shlex.split(rest) if not t.startswith("--")]
            sources = tokens[:-1]
            from_stage = dict(flags).get("from")
            if from_stage is not None:
                if from_stage not in stages:
                    problem(at, "COPY --from=%s: no such earlier stage" %
                            from_stage)
                for s in sources:
                    m = re.search(r"/build/bin/([^/]+)$", s)
                    if m and m.group(1) not in binaries:
                        problem(at, "copies %s, which no add_executable makes" %
                                m.group(1))
                continue
            for s in sources:
                rel = s.rstrip("/") or "."
                if not os.path.exists(os.path.join(src, rel)):
                    problem(at, "COPY source %s does not exist" % s)
                elif rel != "." and is_ignored(rel, ignore):
                    problem(at, "COPY source %s is excluded by %s" %
                            (s, os.path.basename(dockerfile) + ".dockerignore"))
            if tokens and tokens[-1].endswith("gpipe-entrypoint"):
                entry["script"] = sources[0]
        elif word == "RUN":
            for script in re.findall(r"(?:^|[\s;&|])((?:scripts|deploy)/[\w./-]+)",
                                     rest):
                path = os.path.join(src, script)
                if not os.path.isfile(path):
                    problem(at, "RUN names %s, which does not exist" % script)
                elif not os.access(path, os.X_OK):
                    problem(at, "RUN runs %s, which is not executable" % script)
            for target in re.findall(r"--target\s+([^&;|]+)", rest):
                for name in target.split():
                    if name.startswith("-"):
                        break
                    if name not in binaries:
                        problem(at, "builds --target %s, which no "
                                "add_executable makes" % name)
            if re.search(r"apt-get install", rest) and \
                    "--no-install-recommends" not in rest:
                problem(at, "apt-get install without --no-install-recommends")
            if re.search(r"\bsudo\b", rest):
                problem(at, "sudo in an image build")
        elif word == "USER":
            users[len(stages) - 1] = rest.split(":")[0]
        elif word in ("ENTRYPOINT", "CMD"):
            entry[word] = (len(stages) - 1, rest)
    if not stages:
        problem(where, "no FROM")
        return
    last = len(stages) - 1
    user = users.get(last)
    if user is None:
        problem(where, "the runtime stage (%s) never sets USER: it runs as "
                "root" % stages[last])
    elif user in ("root", "0"):
        problem(where, "the runtime stage runs as %s" % user)
    if "ENTRYPOINT" not in entry and "CMD" not in entry:
        problem(where, "the runtime stage has no ENTRYPOINT or CMD")
    if "script" not in entry:
        problem(where, "copies no gpipe-entrypoint")


def main():
    if len(sys.argv) < 3:
        sys.exit("usage: k8s_dockerfile_check.py SOURCE_DIR DOCKERFILE...")
    src = os.path.abspath(sys.argv[1])
    binaries = executables(src)
    for dockerfile in sys.argv[2:]:
        check(src, os.path.abspath(dockerfile), binaries)
    for p in problems:
        print("FAIL:", p)
    print("%d Dockerfiles checked, %d problems" %
          (len(sys.argv) - 2, len(problems)))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

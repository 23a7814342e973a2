# Sourced by the cluster benchmarks: the balanced MLP they train.
# write_mlp_spec FILE NAME BLOCKS PIPELINE STEPS: BLOCKS x (Linear 1024 +
# ReLU) and a 16-class head, batch 256, SGD with momentum, synthetic data;
# PIPELINE is the spec's "pipeline" object as JSON.
write_mlp_spec() {
  local file=$1 name=$2 blocks=$3 pipeline=$4 steps=$5 layers="" i
  for ((i = 0; i < blocks; i++)); do
    layers+='{"linear": {"inFeatures": 1024, "outFeatures": 1024}}, {"relu": {}}, '
  done
  cat >"$file" <<JSON
{"name": "${name}",
 "model": {"input": {"dtype": "FLOAT32", "shape": {"dims": [1024]}},
           "layers": [${layers} {"linear": {"inFeatures": 1024, "outFeatures": 16}}],
           "loss": {"softmaxCrossEntropy": {}}},
 "optimizer": {"lr": 0.01, "sgd": {"momentum": 0.9}},
 "data": {"synthetic": {"task": "CLASSES", "features": 1024, "classes": 16,
                        "trainSamples": 4096, "testSamples": 16}},
 "pipeline": ${pipeline},
 "batchSize": 256, "steps": ${steps}, "seed": 1}
JSON
}

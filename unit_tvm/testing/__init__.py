"""What the tests, benchmarks and figures run on: the model zoo (fixed-seed torch models), the
op workloads (UNIT Table I, GEMMs, ResNet-18-3D) and numpy references for packed layouts. The
compiler does not import it."""

# the zoo's models by name, readable without importing torch (the CLI's help); zoo.MODELS builds
# them and a test keeps the two equal
ZOO_MODELS = ("resnet18", "resnet50", "mobilenet_v2", "inception_v3", "regnet_x_400mf", "r3d_18",
              "bert_base", "vit_b_16", "whisper_encoder", "wav2vec2_base", "causal_s384",
              "bert_layer")

"""unit-tvm: UNIT (Unifying Tensorized Instruction Compilation) on Apache TVM 0.27."""

from setuptools import setup

# intrinsics/ and schedules/ live at the top level (the two extension points) and install
# as unit_tvm.intrinsics and unit_tvm.schedules.
PACKAGE_DIR = {
    "unit_tvm": "unit_tvm",
    "unit_tvm.intrinsics": "intrinsics",
    "unit_tvm.schedules": "schedules",
}

setup(
    name="unit-tvm",
    version="0.1.0",
    description="Tensorized instruction compilation (VNNI, BF16, ARM DOT/I8MM, Tensor Core), TVM",
    python_requires=">=3.10",
    packages=list(PACKAGE_DIR) + ["unit_tvm.tuner", "unit_tvm.cross", "unit_tvm.relax",
                                  "unit_tvm.relax.core", "unit_tvm.relax.frontend",
                                  "unit_tvm.relax.quantization", "unit_tvm.relax.cpu",
                                  "unit_tvm.relax.gpu", "unit_tvm.fuzz", "unit_tvm.bench",
                                  "unit_tvm.fleet", "unit_tvm.testing", "unit_tvm.llm"],
    package_dir=PACKAGE_DIR,
    package_data={"unit_tvm.intrinsics": ["README.md"], "unit_tvm.cross": ["*.c"]},
    install_requires=[
        "apache-tvm==0.27.0.post1",
        # 0.1.15.x segfaults in Schedule.tensorize; 0.1.13.x is refused by apache-tvm.
        "apache-tvm-ffi==0.1.14.post1",
        "numpy>=1.26,<3",
        "ml_dtypes>=0.5",
        "xgboost==3.2.0",
        "tqdm>=4.66",
        "onnx==1.23.2",
        # TVM's RPC tracker and server (unit_tvm.fleet) import tornado, cloudpickle and psutil,
        # which apache-tvm does not require
        "tornado==6.6.1",
        "cloudpickle==3.1.2",
        "psutil==7.2.2",
    ],
    extras_require={
        # the model tests use PyTorch (torch.export) and the ONNX exporter as model sources,
        # and ONNX Runtime as the reference for ONNX files (and the folding from_onnx uses)
        # pytest-xdist: `make test` runs two workers (LLVM builds are single-threaded); mypy:
        # the extension points' signatures (mypy.ini)
        # transformers: unit_tvm.llm's tests build Hugging Face decoders from a config
        "test": ["pytest==9.2.0", "pytest-xdist==3.8.0", "torch==2.13.0", "onnxscript==0.7.2",
                 "matplotlib==3.11.2", "ruff==0.14.0", "onnxruntime==1.31.1", "mypy==2.4.1",
                 "transformers==5.25.0"],
        # the engines bench-model compares: OpenVINO + NNCF, ONNX Runtime, PyTorch FX and PT2E
        # (torchao's X86InductorQuantizer)
        # bench-llm: Hugging Face decoders, GGUF files (gguf), llama.cpp (llama-cpp-python:
        # PyPI has its source only, built for this CPU on install, about 6 minutes on 2 cores)
        # and OpenVINO GenAI (reads the same GGUF files; its tokenizers package with it)
        "bench": ["torch==2.13.0", "matplotlib==3.11.2", "onnxruntime==1.31.1", "onnxscript==0.7.2",
                  "openvino==2026.4.1", "nncf==3.4.0", "torchao==0.18.0", "transformers==5.25.0",
                  "gguf==0.19.0", "llama-cpp-python==0.3.36", "openvino-genai==2026.4.1.0",
                  "openvino-tokenizers==2026.4.1.0"],
    },
    entry_points={"console_scripts": ["unit-tvm=unit_tvm.cli:main"]},
)

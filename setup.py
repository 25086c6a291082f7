from setuptools import find_packages, setup

setup(
    name="gmeta-tf",
    version="0.1.0",
    description="Distributed meta-learning trainer for deep recommendation models (TFRA + Horovod)",
    python_requires=">=3.11,<3.12",
    packages=find_packages(include=["gmeta_tf", "gmeta_tf.*", "ps", "ps.*", "launch", "launch.*"]),
    package_data={"gmeta_tf": ["resources/*"], "launch": ["templates/*", "schemas/*"]},
    install_requires=[
        "numpy==1.26.4",
        "tensorflow==2.16.2",
        "tf-keras==2.16.0",
        "tensorflow-recommenders-addons==0.8.1",
        "pyarrow==16.1.0",
        "click==8.1.7",
        "PyYAML==6.0.2",
        "dacite==1.8.1",
        "scikit-learn==1.5.2",
        "scipy==1.17.1",
        "jsonschema==4.23.0",
        "Jinja2==3.1.4",
        "optuna==4.1.0",
        "kserve==0.15.2",
    ],
    # s3:// (and az://) run directories: TensorFlow has no S3 filesystem built in since 2.6.
    extras_require={"s3": ["tensorflow-io==0.37.1"]},
    entry_points={"console_scripts": ["gmeta=gmeta_tf.cli.main:cli"]},
)

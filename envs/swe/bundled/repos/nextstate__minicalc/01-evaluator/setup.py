from setuptools import setup

setup(
    name="minicalc",
    version="0.3.0",
    description="A tiny arithmetic expression evaluator",
    packages=["minicalc"],
    python_requires=">=3.7",
)

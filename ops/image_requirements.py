"""Prints the image's dependencies from pyproject.toml alone (the build backend, the core
dependencies, the gpu and gateway extras), so ops/Dockerfile installs them in a layer that
no source edit invalidates:  python3 image_requirements.py pyproject.toml > req.txt"""
import sys
import tomllib

EXTRAS = ("gpu", "gateway")

if __name__ == "__main__":
    with open(sys.argv[1] if len(sys.argv) > 1 else "pyproject.toml", "rb") as f:
        data = tomllib.load(f)
    project = data["project"]
    wanted = list(data["build-system"]["requires"]) + list(project["dependencies"])
    for extra in EXTRAS:
        wanted += project["optional-dependencies"][extra]
    print("\n".join(dict.fromkeys(wanted)))

"""The directory users put on PYTHONPATH; only its ``sitecustomize.py`` matters (boilerplate)."""

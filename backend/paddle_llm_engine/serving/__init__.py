"""Triton Python-backend glue shared by the model.py files: tensor parsing and the response path.

Modules here import `triton_python_backend_utils` lazily, so the engine stays importable outside
a Triton stub process.
"""

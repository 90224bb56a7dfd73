"""The formats a checkpoint's parts are written in, and read back without running code.

``standard.py``: the trainer part in a DCP directory; ``sharded.py``: FSDP2
model and optimizer shards; ``dcp_reading.py``: the one way a DCP directory is
read; ``pack.py``: nested state as a JSON skeleton and flat tensors;
``one_file.py``: legacy ``last.pth`` and the best model's ``model_best.pth``;
``safetensors_files.py``: weights without pickle, to and from the ecosystem.
"""

"""course_lib: the lesson library of the course "Feeding PyTorch with data".

What the notebooks and their DataLoader workers import, one module per lesson (``data``/``datasets`` 01,
``transforms`` 02, ``loaders`` 03, ``instrument``/``explorer`` 04, ``workers`` 04-05, ``samplers`` 06,
``distributed``/``train`` 07, ``iterable``/``growing`` 08, ``shards``/``shard_reader`` 09,
``object_store`` 10, ``alternatives`` 11, ``highrate``/``threads``/``gpu_feed`` 12, ``capstone`` 13,
``resume`` 14) and ``checks``; the tools are in :mod:`course_tools`.
"""

__version__ = "0.1.0"

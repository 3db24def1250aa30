"""course_lib: the lesson library of the course "Feeding PyTorch with data".

What the notebooks and their DataLoader workers import, one module per lesson (``data``/``datasets`` 01,
``transforms`` 02, ``loaders`` 03, ``instrument``/``workers``/``explorer`` 04, ``samplers`` 05,
``distributed``/``train`` 06, ``iterable``/``growing`` 07, ``shards``/``shard_reader`` 08,
``alternatives``/``highrate`` 09, ``capstone`` 10) and ``checks``; the tools are in :mod:`course_tools`.
"""

__version__ = "0.1.0"

"""course_lib: the lesson library of the course "Feeding PyTorch with data".

What the notebooks and their DataLoader workers import, one module per lesson: ``data`` and
``datasets`` (notebook 01), ``transforms`` (02), ``loaders`` (03), ``instrument``, ``workers`` and
``explorer`` (04), ``samplers`` (05), ``distributed`` and ``train`` (06), ``iterable`` and
``growing`` (07), ``shards`` and ``shard_reader`` (08), ``alternatives`` and ``highrate`` (09),
``capstone`` (10); ``viz``, ``timing`` and ``pitfalls`` serve them all, ``checks`` holds the
exercises' checks. Every public name's docstring says which notebook teaches it. The
instructors' and maintainers' tools are in :mod:`course_tools`.
"""

__version__ = "0.1.0"

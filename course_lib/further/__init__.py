"""Going further: what the course teaches beyond its brief, kept apart so that the short library stays short.

* :mod:`~course_lib.further.growing` (notebook 08, section 8): a data set that grows while training runs, a
  local cache filled by producer processes and evicted past a size budget;
* :mod:`~course_lib.further.highrate` (notebook 11): raw float32 streams at GB/s, the reused shared-memory
  batch ring (``RingLoader``), small records, and the GB/s-and-CPU harness that measures them.
"""

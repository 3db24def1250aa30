"""Going further: what the course teaches beyond its brief, kept apart so that the short library stays short.

* :mod:`~course_lib.further.growing` (notebook 08, section 8): a data set that grows while training runs, a
  local cache filled by producer processes and evicted past a size budget;
* :mod:`~course_lib.further.highrate` (notebook 12): raw float32 streams at GB/s, the reused shared-memory
  batch ring (``RingLoader``), small records, and the GB/s-and-CPU harness that measures them;
* :mod:`~course_lib.further.threads` (notebook 12, sections 6-7): thread pipelines (SPDL, torchdata.nodes, a
  ``ThreadPoolExecutor`` with reused buffers) against worker processes, on work that releases the GIL and work that
  holds it: GB/s, CPU per GB and PSS;
* :mod:`~course_lib.further.gpu_feed` (notebook 12, section 8): the GPU leg, batches into device memory through
  reused pinned buffers and a CUDA-stream ``Prefetcher``, what ``non_blocking`` promises, JPEG decoding on the GPU,
  with figures recorded on a GPU (``gpu_recordings.json``) shown where there is none.
"""

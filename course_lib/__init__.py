"""course_lib: the helper library of the course "Feeding PyTorch with data".

Modules are named for what they teach:

* :mod:`course_lib.data` generates the offline shapes data set (no downloads);
* :mod:`course_lib.datasets` holds the map-style datasets of notebook 01;
* :mod:`course_lib.transforms` the custom transforms of notebook 02;
* :mod:`course_lib.loaders` batching helpers for notebook 03;
* :mod:`course_lib.instrument`, :mod:`course_lib.workers`, :mod:`course_lib.explorer` the
  DataLoader performance lessons of notebook 04 (:mod:`course_lib.bench` measures them);
* :mod:`course_lib.samplers` index orders, balancing weights and bucketing for notebook 05;
* :mod:`course_lib.distributed` rank and world size from torchrun or Slurm, torchrun launches
  and ``DistributedSampler`` shares for notebook 06; :mod:`course_lib.train` the DDP training
  script (``torchrun -m course_lib.train``) used there and by the Slurm scripts in ``hpc/``;
* :mod:`course_lib.iterable` and :mod:`course_lib.growing` the iterable datasets and the growing
  cache of notebook 07; :mod:`course_lib.shards` writes, lists and checks WebDataset shards for
  notebook 08 and :mod:`course_lib.shard_reader` reads them on every rank;
  :mod:`course_lib.alternatives` the same images as MDS and litdata for notebook 09, and
  :mod:`course_lib.highrate` raw tensor streams at GB/s and the reused-buffer ``RingLoader``;
* :mod:`course_lib.capstone` the DDP shard pipeline of notebook 10 (``torchrun -m
  course_lib.capstone train``) and the Slurm script it writes;
* :mod:`course_lib.viz` the pictures (sample grids, histograms, batch layouts);
* :mod:`course_lib.checks` the self-checking exercises;
* :mod:`course_lib.pitfalls` reproduces errors live; :mod:`course_lib.timing` measures ratios;
* for instructors and maintainers: :mod:`course_lib.preparation` (``python -m course_lib prepare
  --all``), :mod:`course_lib.doctor` (``python -m course_lib doctor``), :mod:`course_lib.slides`
  (the offline decks), :mod:`course_lib.bench` (the benchmarks), :mod:`course_lib.authoring`
  (learner notebooks from solutions).
"""

__version__ = "0.1.0"




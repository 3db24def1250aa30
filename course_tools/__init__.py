"""course_tools: the instructors' and maintainers' tools of the course "Feeding PyTorch with data".

Learners never need to read this package, and neither the lesson library (:mod:`course_lib`) nor a notebook imports
it. Every tool is a command of ``python -m course_lib`` (:mod:`course_tools.cli`):

* :mod:`~course_tools.preparation` and :mod:`~course_tools.cli`: ``prepare`` / ``verify`` the data;
* :mod:`~course_tools.doctor`: ``doctor``, is a participant's environment ready?
* :mod:`~course_tools.bench` and :mod:`~course_tools.store_bench`: ``bench loader|highrate|formats|store``, the benchmarks;
* :mod:`~course_tools.slides`: ``slides build``, the offline decks;
* :mod:`~course_tools.authoring`: ``authoring build|check|renumber``, learner notebooks from solutions, renumbering;
* :mod:`~course_tools.versions`: the tested and accepted versions, in one place;
* :mod:`~course_tools.hub`: ``hub link``, the nbgitpuller link a workshop hands out;
* :mod:`~course_tools.gpu`: ``gpu``, the checklist run where a GPU is.
"""

"""
What the fix costs, stock and fixed side by side on one database:
``python reproduce/bench.py --backend postgres`` (or ``python -m reproduce.bench`` from the clone).
``--cases``/``--skip`` choose cases by name (``--help`` lists them and their options).

Where things are:

- ``runner``: the stock/fixed alternation every case measures with (``Variants``, ``alternate``,
  ``in_rounds``), and why the two variants alternate in one process;
- ``cases/``: one module per case, named as ``--cases`` names it (``fan-out`` is ``cases/fan_out.py``);
  each module's docstring says what the case measures, its functions how;
- ``world``: consumer DAGs, historical events and runs, the planner's statistics;
- ``scheduler`` and ``producers``: a scheduler's passes and a producer's transaction, as the cases run them;
  ``rounds``: producer processes beside a scheduler thread (the busy-dataset and fleet cases);
- ``figures``: medians, percentiles and the table's rows; ``report``: the table and each target;
- ``cli``: the options, and the cases run in their order.
"""

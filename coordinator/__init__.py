"""The MetaService: the worker that hands out global barriers (``stream/``), and its contract with
every other process, which each package imports: the vocabulary and rules (``domain/``, standard
library only), the event codec (``codec/``), the clients that send commands and fold its state
(``client/``), one ``Settings``, and the Spark SQL dialect and column lineage the worker's page
shares with the data plane (``spark_sql.py``, ``columns.py``)."""

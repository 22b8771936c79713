"""The data pipeline on Spark (PySpark): jobs over TxSync's logs and replicas.

``txsync pipeline <job>`` runs a job on ``--master`` (default ``local[*]``: this
machine's cores); the same modules run under ``spark-submit`` on any Spark cluster.
PySpark is an optional extra (``pip install 'txsync[pipeline]'``) so service images stay
small. Jobs:

* ``export``: DCs' txlogs -> Parquet datasets (transactions, synced order, transitions);
* ``audit-order``: do all DCs hold the same order? The first disagreement, exactly;
* ``verify-replicas``: do all workers hold the same data? Every differing row, by key;
* ``report``: latency per step and DC, throughput, failures (HTML, PNG plots, JSON);
* ``load``: rows of CSV or Parquet -> transactions, resumable by idempotency keys.

``txlog_rows`` reads a txlog without Spark (it is what the executors run).
"""

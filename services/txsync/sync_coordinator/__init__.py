"""sync-coordinator: makes several DCs one cluster.

Drives the pure protocol core (``txsync.protocol``) over gRPC: posts and collects rounds
with the other DCs' coordinators, pushes and fetches bodies, serves laggers, and (with
views) keeps a partition from forking the order. Reads and writes the txlog only through
the transaction-store's internal API.

Here so far: ``wire`` (core values <-> ``txsync.v1`` messages). The gRPC service comes
with issue 4.
"""

"""Ingestion: loaders, chunking and an incremental run into an index folder (indexrun) or a
PostgreSQL store (storerun)."""

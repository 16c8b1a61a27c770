"""Ingestion: loaders, chunking and the incremental pipeline."""

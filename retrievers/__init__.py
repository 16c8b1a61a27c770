"""Retrieval stages: BM25, FAISS, fusion, filters, compressors and the on-disk index."""

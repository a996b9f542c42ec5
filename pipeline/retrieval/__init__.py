"""Retrieval: a query in, the best chunks out (dense and lexical search fused, reranked), and its evaluation."""

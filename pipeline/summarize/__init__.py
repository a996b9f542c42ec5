"""Batch summaries: resumable jobs over whole documents (map-reduce where they do not fit), their outputs and
job stores."""

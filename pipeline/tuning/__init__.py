"""Offload and batch tuning: what a model is made of, its memory and speed estimated, the fastest settings that fit
chosen (`rag plan`), and candidates measured on this machine (`rag tune`)."""

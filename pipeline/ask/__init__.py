"""Asking: a question in, an answer with its sources out (request, flow, packing, prompt layout, answers)."""

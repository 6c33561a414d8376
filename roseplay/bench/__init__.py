"""`roseplay bench`: the in-process bench (inproc.py), the HTTP one (http.py, clients.py,
sse.py), the HF baseline (hf_compare.py) and the report both print (report.py)."""

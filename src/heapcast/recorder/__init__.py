"""Recording: `heapcast record` launches the program under the recorder library
(native/recorder), runs the drainer (`drain`) and the converter (`live`) beside it, and
finalizes the trace after its exit (`session`: `record`, `finalize`)."""

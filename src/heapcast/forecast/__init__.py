"""Forecasting heap behaviour from traces: token vocabularies, datasets, models, evaluation.

    heapcast.forecast.dataset.build_dataset(traces, out_dir)        # heapcast dataset
    heapcast.forecast.train.train(traces, "m.safetensors")          # heapcast train
    heapcast.forecast.evaluate.evaluate(model, traces, "cross-run") # heapcast evaluate
    heapcast.forecast.lifetime.predict_lifetime_classes(model, process)

Vocabularies, lifetime classes and the model file format: docs/vocabularies.md. torch is needed
only by the neural models (gru, lstm, seed): `pip install 'heapcast[ml]'`.
"""
import os

# PyTorch's OpenMP threads spin while they wait by default. On a 2-core machine shared with any
# other busy process that turns a GRU training step into a ~20x slower one (seen here: 16k vs 600
# events/s); passive waiting costs little. Set before torch is imported (the models import it
# lazily); a user's own setting wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

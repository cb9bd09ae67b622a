"""Forecasting heap behaviour from traces: token vocabularies, datasets, models, evaluation.

    heapcast.forecast.dataset.build_dataset(traces, out_dir)        # heapcast dataset
    heapcast.forecast.train.train(traces, "m.safetensors")          # heapcast train
    heapcast.forecast.evaluate.evaluate(model, traces, "cross-run") # heapcast evaluate
    heapcast.forecast.lifetime.predict_lifetime_classes(model, process)

Vocabularies, lifetime classes and the model file format: docs/vocabularies.md. torch is needed
only by the neural models (gru, lstm, seed): `pip install 'heapcast[ml]'`.
"""

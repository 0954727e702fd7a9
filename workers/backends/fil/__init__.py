"""Tree models under Triton's FIL backend contract (``backend: "fil"``): the backend (``backend``), its
parameters (``settings``) and the models as XGBoost, LightGBM, scikit-learn and Treelite load and run
them (``forests``). Frameworks are imported only when a model of theirs loads (``pip install 'conveyor[fil]'``)."""

"""What is done with trained models:

- ``distillation``: a teacher's soft targets for a smaller student;
- ``temperature``: temperature scaling fitted on val (``calibrate=temperature``) and stored with its model;
- ``checkpoint_evaluation``: evaluating a saved model in every process (``evaluate``)."""

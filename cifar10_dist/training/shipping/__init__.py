"""Making a trained model ready to ship, and checking a shipped one:

- ``distillation``: a teacher's soft targets for a smaller student;
- ``temperature``: temperature scaling fitted on val (``calibrate=temperature``) and stored with its model;
- ``checkpoint_evaluation``: evaluating a saved model in every process (``evaluate``)."""

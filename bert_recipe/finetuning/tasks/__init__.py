"""Task readers for fine-tuning: GLUE (tasks.glue) and SQuAD (tasks.squad)."""

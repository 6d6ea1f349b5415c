"""Task readers for fine-tuning: GLUE (processors.glue) and SQuAD (processors.squad)."""

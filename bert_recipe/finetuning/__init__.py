"""Fine-tuning: its flags, the recipe every task script shares, prediction, the tasks."""

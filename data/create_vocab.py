"""Learn a WordPiece vocabulary from your text: bert_recipe/prep/vocab.py holds the learner and this command's
flags (`python data/create_vocab.py --help`, or `python -m data.create_vocab --help` from the checkout)."""

import sys

try:
    from bert_recipe.prep.vocab import main
except ModuleNotFoundError as e:  # run as a file from a checkout that was never installed
    raise SystemExit(
        f"create_vocab.py: error: {e}: install the project (pip install -e . in the checkout, as "
        "scripts/setup_cpu.sh does) or run `python -m data.create_vocab ...` from the checkout"
    ) from None

if __name__ == "__main__":
    sys.exit(main())

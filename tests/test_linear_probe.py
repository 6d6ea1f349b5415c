"""bench/linear_probe.py: the features are the written-out [CLS] vector and masked mean of the encoder's last
layer; the probe on the real all-MiniLM-L6-v2 (a sentence encoder) reads SST-2 sentiment far above the majority
class and above the same architecture's random initialisation."""

from __future__ import annotations

import json

import torch

from bench import linear_probe
from bert_recipe.io.checkpoint_io import from_pretrained
from bert_recipe.tasks.glue import encode_examples, get_task, get_train_examples
from modeling import BertModel
from tokenization import BertTokenizer


def test_features_are_the_cls_vector_and_the_masked_mean(minilm_dir, shared_data):
    task = get_task("sst-2")
    examples = get_train_examples(shared_data / "glue-sst2", task)[:40]
    encoded = encode_examples(examples, BertTokenizer(str(minilm_dir / "vocab.txt"), do_lower_case=True), 128, task)
    model = from_pretrained(BertModel, minilm_dir, log=None).eval()
    got = linear_probe.sentence_features(model, encoded, batch_size=16)
    for i in (0, 7, 39):  # each sentence alone, unpadded: no mask involved at all
        ids, types = (torch.from_numpy(a).long()[None] for a in encoded.example(i))
        with torch.no_grad():
            seq = model(ids, types)[0][0]  # [L, H]
        torch.testing.assert_close(torch.from_numpy(got["cls"][i]), seq[0], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(torch.from_numpy(got["mean"][i]), seq.mean(0), rtol=1e-4, atol=1e-5)
    # --layer 0: the first encoder layer's output, i.e. that layer applied to the embeddings
    first = linear_probe.sentence_features(model, encoded, batch_size=16, layer=0)
    ids, types = (torch.from_numpy(a).long()[None] for a in encoded.example(3))
    with torch.no_grad():
        x = model.embeddings(ids, types)  # [1, L, H]
        layer0 = model.encoder.layer[0](x, None)[0]  # [L, H]
    torch.testing.assert_close(torch.from_numpy(first["mean"][3]), layer0.mean(0), rtol=1e-4, atol=1e-5)


def test_probe_reads_sentiment_from_minilm_and_not_from_random_weights(tmp_path, minilm_dir, shared_data):
    state = {k: v for k, v in from_pretrained(BertModel, minilm_dir, log=None).state_dict().items()}
    torch.manual_seed(0)
    random = BertModel(from_pretrained(BertModel, minilm_dir, log=None).config)
    assert any(not torch.equal(v, state[k]) for k, v in random.state_dict().items())
    (tmp_path / "random").mkdir()
    torch.save({"model": random.state_dict(), "config": random.config.to_dict()}, tmp_path / "random" / "m.pt")
    report = linear_probe.main(
        [
            "--checkpoint",
            f"minilm={minilm_dir}",
            "--checkpoint",
            f"random={tmp_path / 'random' / 'm.pt'}",
            "--vocab_file",
            str(minilm_dir / "vocab.txt"),
            "--max_train_examples",
            "1500",
            "--max_eval_examples",
            "300",
            "--out",
            str(tmp_path / "probe.json"),
        ]
    )
    assert json.loads((tmp_path / "probe.json").read_text()) == report
    minilm, rand = report["results"]["minilm"], report["results"]["random"]
    assert 0.5 <= report["majority"] < 0.6
    assert minilm["mean"]["dev_accuracy"] > report["majority"] + 0.15
    assert minilm["mean"]["dev_accuracy"] > rand["mean"]["dev_accuracy"] + 0.05

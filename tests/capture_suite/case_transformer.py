"""(b) A real architecture: a small BERT from transformers (random weights, nothing downloaded),
its feed-forward with relu, compiled with inductor's relu bug."""

import torch
import transformers


@torch._inductor.config.patch({"cpp.inject_relu_bug_TESTING_ONLY": "compile_error"})
def test_bert_compiles() -> None:
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=32, max_position_embeddings=16, hidden_act="relu")
    model = transformers.BertModel(config).eval()
    input_ids = torch.randint(0, 64, (1, 8))
    with torch.no_grad():
        torch.compile(model)(input_ids)

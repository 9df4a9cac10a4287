import torch, transformers
from transformers import LlamaConfig, LlamaForCausalLM, GPT2Config, GPT2LMHeadModel
from torch.profiler import profile, ProfilerActivity
torch.set_num_threads(1)
def build(kind, layers):
    torch.manual_seed(0)
    if kind=="llama":
        m=LlamaForCausalLM(LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512))
    else:
        m=GPT2LMHeadModel(GPT2Config(vocab_size=128, n_positions=512, n_embd=64, n_layer=layers, n_head=4))
    m.set_attn_implementation("sdpa"); m.generation_config.pad_token_id=0
    return m.eval()
class Count(transformers.StoppingCriteria):
    def __init__(s): s.prof=None; s.n=0; s.counts=[]
    def __call__(s, input_ids, scores, **kw):
        return torch.zeros(input_ids.shape[0], dtype=torch.bool)
def steps(kind, layers, n=6):
    m=build(kind, layers); ids=torch.randint(3,128,(2,32))
    with torch.no_grad():
        m.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=4, do_sample=False)
        with profile(activities=[ProfilerActivity.CPU]) as p1:
            m.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=1, do_sample=False)
        with profile(activities=[ProfilerActivity.CPU]) as p2:
            m.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=1+n, do_sample=False)
    def top(p):
        ev=[e for e in p.events() if e.name.startswith("aten::")]
        # top-level aten calls: those with no aten parent
        c=0
        for e in ev:
            par=e.cpu_parent
            while par is not None and not par.name.startswith("aten::"): par=par.cpu_parent
            if par is None: c+=1
        return c
    return (top(p2)-top(p1))/n
for kind in ("llama","gpt2"):
    a,b=steps(kind,2),steps(kind,4)
    per_layer=(b-a)/2; print(kind, "per step", a, b, "per layer", per_layer, "outside", a-2*per_layer)

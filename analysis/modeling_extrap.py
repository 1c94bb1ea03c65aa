"""transformers classes for an extrap model that no transformers class computes: `extrap export
--format hf` writes this file, and extrap_model.py beside it, into the folder, and

    AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True)   # a causal LM
    AutoModelForMaskedLM.from_pretrained(DIR, trust_remote_code=True)   # a masked LM

load it. The model is extrap_model.py's ExtrapModel, the plain-PyTorch reader, unchanged: every
position method, layer pattern, attention option and architecture option it reads (its docstring
lists them), computed as it computes them. These classes only give it transformers' interfaces:
logits (B, T, V), a loss for labels, attentions for output_attentions, and generate().

The folder's model.safetensors is the file `extrap export` writes (format extrap-safetensors, the
reader's tensor names; extrap_model.load() reads it too); config.json carries its metadata under
"extrap_metadata", so that the model is built before its weights are read.

What is refused, in one line, rather than computed differently: padding (an attention_mask with a
zero: extrap's positions count from each row's first token, so rows of a batch have one length),
inputs_embeds, output_hidden_states, a model loaded without every one of its tensors (from_config:
there is no initialisation here; the weights come from the folder). generate() recomputes the whole
sequence at each step (no key-value cache): exact, and slow for long outputs.
"""
import torch
import torch.nn.functional as F
from transformers import GenerationMixin, PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutput, MaskedLMOutput

from .extrap_model import ExtrapModel, _metadata


class ExtrapConfig(PretrainedConfig):
    model_type = "extrap"

    def __init__(self, extrap_metadata=None, **kwargs):
        self.extrap_metadata = dict(extrap_metadata or {})
        super().__init__(**kwargs)


class _ExtrapPreTrainedModel(PreTrainedModel):
    config_class = ExtrapConfig
    base_model_prefix = "model"
    main_input_name = "input_ids"

    def __init__(self, config):
        super().__init__(config)
        if not config.extrap_metadata:
            raise ValueError("config.json has no extrap_metadata: this folder was not written by `extrap export --format hf`")
        self.model = ExtrapModel(_metadata(config.extrap_metadata), dtype=torch.get_default_dtype())
        self._weights_checked = False
        self.post_init()

    def _init_weights(self, module):  # every weight comes from the folder (checked at the first forward)
        pass

    def _check_weights(self):
        if self._weights_checked:
            return
        missing = [name for name, p in self.model.named_parameters() if p.is_meta]
        if missing:
            raise ValueError(f"{len(missing)} of the model's tensors were not loaded ({', '.join(missing[:4])}"
                             f"{', ...' if len(missing) > 4 else ''}): load it with from_pretrained(DIR) from the "
                             "folder `extrap export --format hf` wrote")
        self._weights_checked = True

    def _logits(self, input_ids, attention_mask, inputs_embeds, output_attentions, output_hidden_states):
        self._check_weights()
        if inputs_embeds is not None or input_ids is None:
            raise ValueError("extrap models take input_ids, not inputs_embeds")
        if output_hidden_states:
            raise ValueError("output_hidden_states is not offered by extrap models; the reader's "
                             "model.model.hidden(input_ids) gives the final norm's output")
        if attention_mask is not None and not bool(attention_mask.bool().all()):
            raise ValueError("extrap models take no padding: attention_mask must be all ones (positions count "
                             "from each row's first token; batch rows of one length)")
        if output_attentions:
            return self.model(input_ids, return_attention=True)
        return self.model(input_ids), None


class ExtrapForCausalLM(_ExtrapPreTrainedModel, GenerationMixin):
    """Logits (B, T, V) of a causal extrap model (with adaptive bands: the log-probabilities)."""

    def __init__(self, config):
        super().__init__(config)
        if not self.model.causal:
            raise ValueError("this folder holds a masked LM: load it with AutoModelForMaskedLM")

    def forward(self, input_ids=None, attention_mask=None, labels=None, inputs_embeds=None,
                output_attentions=None, output_hidden_states=None, return_dict=None, **kwargs):
        logits, attentions = self._logits(input_ids, attention_mask, inputs_embeds, output_attentions,
                                          output_hidden_states)
        loss = None
        if labels is not None:  # transformers' rule: position i predicts labels[i + 1]; -100 is ignored
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten().to(logits.device),
                                   ignore_index=-100)
        return CausalLMOutput(loss=loss, logits=logits, attentions=tuple(attentions) if attentions else None)

    def prepare_inputs_for_generation(self, input_ids, attention_mask=None, **kwargs):
        # No key-value cache: each step computes the whole sequence again.
        return {"input_ids": input_ids, "attention_mask": attention_mask}


class ExtrapForMaskedLM(_ExtrapPreTrainedModel):
    """Logits (B, T, V) of a bidirectional (masked-LM) extrap model."""

    def __init__(self, config):
        super().__init__(config)
        if self.model.causal:
            raise ValueError("this folder holds a causal LM: load it with AutoModelForCausalLM")

    def forward(self, input_ids=None, attention_mask=None, labels=None, inputs_embeds=None,
                output_attentions=None, output_hidden_states=None, return_dict=None, **kwargs):
        logits, attentions = self._logits(input_ids, attention_mask, inputs_embeds, output_attentions,
                                          output_hidden_states)
        loss = None
        if labels is not None:  # every position with a label other than -100
            loss = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten().to(logits.device), ignore_index=-100)
        return MaskedLMOutput(loss=loss, logits=logits, attentions=tuple(attentions) if attentions else None)

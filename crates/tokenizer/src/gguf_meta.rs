//! Reading a [`TokenizerSpec`] from GGUF metadata.

use crate::error::TokenizerError;
use crate::spec::TokenizerSpec;

fn meta(e: gguf::GgufError) -> TokenizerError {
    TokenizerError::Metadata(e.to_string())
}

fn missing(key: &str) -> TokenizerError {
    TokenizerError::Metadata(format!("the file has no {key}, so it carries no tokenizer"))
}

fn owned(v: Vec<&str>) -> Vec<String> {
    v.into_iter().map(str::to_owned).collect()
}

/// The `tokenizer.ggml.*` keys and `tokenizer.chat_template` of a GGUF file.
pub fn spec_from_metadata(md: &gguf::Metadata) -> Result<TokenizerSpec, TokenizerError> {
    const MODEL: &str = "tokenizer.ggml.model";
    const TOKENS: &str = "tokenizer.ggml.tokens";
    const TYPES: &str = "tokenizer.ggml.token_type";
    let model = md
        .get_str(MODEL)
        .map_err(meta)?
        .ok_or_else(|| missing(MODEL))?;
    let tokens = md
        .get_strings(TOKENS)
        .map_err(meta)?
        .ok_or_else(|| missing(TOKENS))?;
    let token_types = md
        .get_ints(TYPES)
        .map_err(meta)?
        .unwrap_or_default()
        .into_iter()
        .map(|t| {
            i32::try_from(t)
                .map_err(|_| TokenizerError::Metadata(format!("{TYPES}: {t} is not a token type")))
        })
        .collect::<Result<Vec<i32>, _>>()?;
    let merges = md
        .get_strings("tokenizer.ggml.merges")
        .map_err(meta)?
        .unwrap_or_default();
    let id = |k: &str| md.get_u32(k).map_err(meta);
    let text = |k: &str| md.get_str(k).map_err(meta).map(|s| s.map(str::to_owned));
    Ok(TokenizerSpec {
        model: model.to_owned(),
        pre: text("tokenizer.ggml.pre")?,
        tokens: owned(tokens),
        token_types,
        merges: owned(merges),
        bos_id: id("tokenizer.ggml.bos_token_id")?,
        eos_id: id("tokenizer.ggml.eos_token_id")?,
        eot_id: id("tokenizer.ggml.eot_token_id")?,
        pad_id: id("tokenizer.ggml.padding_token_id")?,
        add_bos: md
            .get_bool("tokenizer.ggml.add_bos_token")
            .map_err(meta)?
            .unwrap_or(false),
        chat_template: text("tokenizer.chat_template")?,
    })
}

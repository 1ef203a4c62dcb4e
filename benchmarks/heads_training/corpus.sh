# The Qwen head data recipe (this folder's README): sourced by train_four.sh and
# hydrapp_options.sh so every set trains on the same cached hidden states.
qwen_corpus=(--target qwen2.5-coder-1.5b --set prompts=192 --set validation=24 --set answer_tokens=96
             --set prompt_tokens=256 --set "epochs=${EPOCHS:-8}")

// Greedy tokens from transformers.js on a local VLM folder (transformers.js layout), as JSON on stdout.
//
//   node vlm_greedy.mjs FOLDER IMAGE PROMPT MAX_NEW_TOKENS [DTYPE]
//
// Loads the folder exactly as a transformers.js user would (AutoProcessor and
// AutoModelForImageTextToText, fp32, CPU), local files only, renders one user turn
// [image, text] with the folder's chat template and prints one JSON object:
// {"prompt_ids": [...], "tokens": [...], "inputs": {name: {"dims": [...], "dtype": ..., "b64": ...}}}
// (the prompt after image expansion, the new tokens, and the vision inputs its processor made, so a
// test can tell preprocessing differences from model differences).
import path from 'node:path';

import { AutoModelForImageTextToText, AutoProcessor, RawImage, env } from '@huggingface/transformers';

const [folder, imagePath, prompt, maxNew, dtype = 'fp32'] = process.argv.slice(2);
if (!folder || !imagePath || prompt === undefined || !maxNew) {
    console.error('usage: node vlm_greedy.mjs FOLDER IMAGE PROMPT MAX_NEW_TOKENS');
    process.exit(2);
}
env.allowRemoteModels = false;
env.allowLocalModels = true;
env.localModelPath = path.dirname(path.resolve(folder)) + path.sep;
const id = path.basename(path.resolve(folder));

const processor = await AutoProcessor.from_pretrained(id);
// DTYPE: one name for every part, or a JSON object per part ({"decoder_model_merged": "q4", ...})
const parts = dtype.startsWith('{') ? JSON.parse(dtype) : dtype;
const model = await AutoModelForImageTextToText.from_pretrained(id, { dtype: parts, device: 'cpu' });
const messages = [{ role: 'user', content: [{ type: 'image' }, { type: 'text', text: prompt }] }];
const text = processor.apply_chat_template(messages, { add_generation_prompt: true });
const image = await RawImage.read(imagePath);
const inputs = await processor(text, image);
const output = await model.generate({ ...inputs, max_new_tokens: Number(maxNew), do_sample: false });
const promptLength = inputs.input_ids.dims[1];
const all = output.tolist()[0].map(Number);
const vision = {};
for (const name of ['pixel_values', 'pixel_attention_mask', 'image_grid_thw']) {
    const tensor = inputs[name];
    if (tensor) {
        const bytes = Buffer.from(tensor.data.buffer, tensor.data.byteOffset, tensor.data.byteLength);
        vision[name] = { dims: tensor.dims, dtype: tensor.type, b64: bytes.toString('base64') };
    }
}
console.log(JSON.stringify({ prompt_ids: all.slice(0, promptLength), tokens: all.slice(promptLength), inputs: vision }));
await model.dispose();

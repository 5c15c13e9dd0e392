// The official `ollama` JavaScript library (npm) against `tandem serve`: list, show, generate and chat, each
// streaming and not, embed and embeddings, and an unknown model. Starts the server itself:
//   node tests/node/ollama-client.mjs TANDEM_BINARY MODEL.gguf
// Exit 0 when every check holds, 1 otherwise; 77 (skipped) when the library is not installed (npm ci here).
import { startTandem, checker } from './tandem-server.mjs'
import assert from 'node:assert/strict'

let Ollama
try {
  ;({ Ollama } = await import('ollama'))
} catch {
  console.log('skipped: the ollama package is not installed (cd tests/node && npm ci)')
  process.exit(77)
}

const [tandem, model] = process.argv.slice(2)
const { host, server } = await startTandem(tandem, model, ['--parallel', '2', '--alias', 'stories'])
const { check, finish } = checker()
const ollama = new Ollama({ host })

const greedy = { temperature: 0, num_predict: 16 }

await check('list names the served model', async () => {
  const r = await ollama.list()
  assert.equal(r.models.length, 1)
  assert.equal(r.models[0].name, 'stories:latest')
  assert.equal(r.models[0].details.format, 'gguf')
  assert.ok(r.models[0].size > 0)
})

await check('show describes it', async () => {
  const r = await ollama.show({ model: 'stories' })
  assert.equal(r.details.family, 'llama')
  assert.equal(r.model_info['llama.block_count'], 5)
})

await check('generate, not streamed, is the OpenAI completion', async () => {
  const r = await ollama.generate({ model: 'stories', prompt: 'Once upon a time', options: greedy })
  assert.equal(r.done, true)
  assert.equal(r.done_reason, 'length')
  assert.equal(r.eval_count, 16)
  const openai = await fetch(`${host}/v1/completions`, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ prompt: 'Once upon a time', max_tokens: 16, temperature: 0 }),
  }).then((x) => x.json())
  assert.equal(r.response, openai.choices[0].text)
})

await check('generate, streamed, gives the same text', async () => {
  const whole = await ollama.generate({ model: 'stories', prompt: 'Once upon a time', options: greedy })
  let text = ''
  let last
  for await (const part of await ollama.generate({ model: 'stories', prompt: 'Once upon a time', options: greedy, stream: true })) {
    text += part.response
    last = part
  }
  assert.ok(last.done)
  assert.equal(last.prompt_eval_count, whole.prompt_eval_count)
  assert.equal(text, whole.response)
})

await check('chat, streamed and not, give the same reply', async () => {
  const messages = [{ role: 'user', content: 'Tell me a story.' }]
  const whole = await ollama.chat({ model: 'stories:latest', messages, options: greedy })
  assert.equal(whole.message.role, 'assistant')
  assert.ok(whole.message.content.length > 0)
  let text = ''
  for await (const part of await ollama.chat({ model: 'stories:latest', messages, options: greedy, stream: true })) {
    text += part.message.content
  }
  assert.equal(text, whole.message.content)
})

await check('a seed gives the same sampled text twice', async () => {
  const opts = { temperature: 0.8, seed: 42, num_predict: 24 }
  const a = await ollama.generate({ model: 'stories', prompt: 'The cat', options: opts })
  const b = await ollama.generate({ model: 'stories', prompt: 'The cat', options: opts })
  assert.equal(a.response, b.response)
})

await check('embed gives unit vectors, in input order; embeddings the raw one', async () => {
  const r = await ollama.embed({ model: 'stories', input: ['Once upon a time', 'The end'] })
  assert.equal(r.embeddings.length, 2)
  assert.equal(r.embeddings[0].length, 64)
  const norm = Math.hypot(...r.embeddings[0])
  assert.ok(Math.abs(norm - 1) < 1e-5, `norm ${norm}`)
  assert.notDeepEqual(r.embeddings[0], r.embeddings[1])
  const one = await ollama.embed({ model: 'stories', input: 'The end' })
  assert.deepEqual(one.embeddings[0], r.embeddings[1])
  const raw = await ollama.embeddings({ model: 'stories', prompt: 'Once upon a time' })
  const rawNorm = Math.hypot(...raw.embedding)
  raw.embedding.forEach((x, i) => assert.ok(Math.abs(x / rawNorm - r.embeddings[0][i]) < 1e-5))
})

await check('an unknown model is a 404 the library reports', async () => {
  await assert.rejects(ollama.chat({ model: 'llama3:8b', messages: [{ role: 'user', content: 'hi' }] }), (e) => {
    assert.equal(e.status_code, 404)
    assert.match(e.error, /llama3:8b/)
    return true
  })
})

finish(server)

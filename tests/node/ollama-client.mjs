// The official `ollama` JavaScript library (npm) against `tandem serve`: list, show, generate and chat, each
// streaming and not, and an unknown model. Starts the server itself:
//   node tests/node/ollama-client.mjs TANDEM_BINARY MODEL.gguf
// Exit 0 when every check holds, 1 otherwise; 77 (skipped) when the library is not installed (npm ci here).
import { spawn } from 'node:child_process'
import assert from 'node:assert/strict'

let Ollama
try {
  ;({ Ollama } = await import('ollama'))
} catch {
  console.log('skipped: the ollama package is not installed (cd tests/node && npm ci)')
  process.exit(77)
}

const [tandem, model] = process.argv.slice(2)
const server = spawn(tandem, ['serve', '-m', model, '--port', '0', '--parallel', '2', '--alias', 'stories'], {
  stdio: ['ignore', 'ignore', 'pipe'],
})
const port = await new Promise((resolve, reject) => {
  let log = ''
  const timer = setTimeout(() => reject(new Error(`tandem serve did not start: ${log}`)), 30000)
  server.stderr.on('data', (d) => {
    log += d
    const m = log.match(/listening on http:\/\/127\.0\.0\.1:(\d+)/)
    if (m) {
      clearTimeout(timer)
      resolve(Number(m[1]))
    }
  })
  server.on('exit', (code) => reject(new Error(`tandem serve exited with ${code}: ${log}`)))
})
const host = `http://127.0.0.1:${port}`
const ollama = new Ollama({ host })

let passed = 0
let failed = 0
async function check(name, fn) {
  try {
    await fn()
    passed++
    console.log(`ok   ${name}`)
  } catch (e) {
    failed++
    console.log(`FAIL ${name}: ${e.stack || e}`)
  }
}

// The server needs a moment after "listening" before the model is attached.
for (let i = 0; i < 100; i++) {
  const r = await fetch(`${host}/health`).catch(() => null)
  if (r && r.status === 200) break
  await new Promise((r) => setTimeout(r, 50))
}

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

await check('an unknown model is a 404 the library reports', async () => {
  await assert.rejects(ollama.chat({ model: 'llama3:8b', messages: [{ role: 'user', content: 'hi' }] }), (e) => {
    assert.equal(e.status_code, 404)
    assert.match(e.error, /llama3:8b/)
    return true
  })
})

server.kill('SIGTERM')
console.log(`${passed} passed, ${failed} failed`)
process.exit(failed === 0 ? 0 : 1)

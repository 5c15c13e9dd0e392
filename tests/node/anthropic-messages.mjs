// The official `@anthropic-ai/sdk` JavaScript SDK (npm) against `tandem serve`'s Messages API, as Claude Code
// and Anthropic clients use it: messages.create, the same reply through the SDK's messages.stream helper
// (text events, finalMessage), a tool use asked for by name and its result sent back, countTokens, the key
// sent as x-api-key, and the SDK's errors. Starts the server itself:
//   node tests/node/anthropic-messages.mjs TANDEM_BINARY MODEL.gguf
// Exit 0 when every check holds, 1 otherwise; 77 (skipped) when the SDK is not installed (npm ci here).
import { startTandem, checker } from './tandem-server.mjs'
import assert from 'node:assert/strict'

let Anthropic
try {
  ;({ default: Anthropic } = await import('@anthropic-ai/sdk'))
} catch {
  console.log('skipped: the @anthropic-ai/sdk package is not installed (cd tests/node && npm ci)')
  process.exit(77)
}

const [tandem, model] = process.argv.slice(2)
const key = 'tandem-test-key'
const { host, server } = await startTandem(tandem, model, [
  '--parallel', '2', '--alias', 'stories', '-c', '4096', '--api-key', key,
])
const { check, finish } = checker()
const client = new Anthropic({ baseURL: host, apiKey: key, maxRetries: 0 })
const greedy = { model: 'stories', temperature: 0 }
const ask = [{ role: 'user', content: 'Once upon a time' }]
const textOf = (m) => m.content.filter((b) => b.type === 'text').map((b) => b.text).join('')

await check('messages.create, and the same reply through the stream helper', async () => {
  const whole = await client.messages.create({ ...greedy, max_tokens: 24, messages: ask })
  assert.equal(whole.type, 'message')
  assert.equal(whole.role, 'assistant')
  assert.match(whole.id, /^msg_/)
  assert.ok(['end_turn', 'max_tokens'].includes(whole.stop_reason))
  assert.ok(textOf(whole).length > 0)
  assert.ok(whole.usage.output_tokens > 0)

  let streamedText = ''
  const stream = client.messages.stream({ ...greedy, max_tokens: 24, messages: ask })
  stream.on('text', (t) => (streamedText += t))
  const final = await stream.finalMessage()
  assert.equal(streamedText, textOf(whole))
  assert.equal(textOf(final), textOf(whole))
  assert.equal(final.stop_reason, whole.stop_reason)
  assert.equal(final.usage.output_tokens, whole.usage.output_tokens)
})

await check('a tool use asked for by name, streamed and not, and its result sent back', async () => {
  const tools = [
    {
      name: 'get_weather',
      description: 'Weather in a city',
      input_schema: {
        type: 'object',
        properties: { city: { type: 'string', maxLength: 12 } },
        required: ['city'],
      },
    },
  ]
  const req = {
    ...greedy,
    max_tokens: 80,
    tools,
    tool_choice: { type: 'tool', name: 'get_weather' },
    messages: [{ role: 'user', content: 'Weather in Paris?' }],
  }
  const m = await client.messages.create(req)
  assert.equal(m.stop_reason, 'tool_use')
  const use = m.content.find((b) => b.type === 'tool_use')
  assert.ok(use, JSON.stringify(m.content))
  assert.equal(use.name, 'get_weather')
  assert.match(use.id, /^toolu_/)
  assert.equal(typeof use.input.city, 'string')

  const streamed = await client.messages.stream(req).finalMessage()
  const sUse = streamed.content.find((b) => b.type === 'tool_use')
  assert.deepEqual(sUse.input, use.input)
  assert.equal(streamed.stop_reason, 'tool_use')

  const next = await client.messages.create({
    ...greedy,
    max_tokens: 16,
    tools,
    messages: [
      ...req.messages,
      { role: 'assistant', content: m.content },
      { role: 'user', content: [{ type: 'tool_result', tool_use_id: use.id, content: '21C and sunny' }] },
    ],
  })
  assert.ok(['end_turn', 'max_tokens', 'tool_use'].includes(next.stop_reason))
})

await check('countTokens counts what create is given', async () => {
  const counted = await client.messages.countTokens({ model: 'stories', system: 'Be brief.', messages: ask })
  const m = await client.messages.create({ model: 'stories', max_tokens: 1, system: 'Be brief.', messages: ask })
  assert.equal(counted.input_tokens, m.usage.input_tokens + (m.usage.cache_read_input_tokens ?? 0))
})

await check("the SDK's errors carry the server's 400, 401 and 404", async () => {
  await assert.rejects(
    client.messages.create({ ...greedy, max_tokens: 4, messages: [{ role: 'user', content: [{ type: 'image', source: { type: 'url', url: 'x' } }] }] }),
    (e) => e.status === 400 && e.error?.error?.type === 'invalid_request_error' && /image/.test(e.message),
  )
  await assert.rejects(
    client.messages.create({ ...greedy, model: 'claude-opus-4-1', max_tokens: 4, messages: ask }),
    (e) => e.status === 404,
  )
  const stranger = new Anthropic({ baseURL: host, apiKey: 'wrong', maxRetries: 0 })
  await assert.rejects(stranger.messages.create({ ...greedy, max_tokens: 4, messages: ask }), (e) => e.status === 401)
})

finish(server)

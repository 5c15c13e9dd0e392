// The official `openai` JavaScript SDK's Responses API (client.responses) against `tandem serve`: create with
// its output_text, the same reply streamed through the SDK's event parser and its stream helper, a
// conversation continued by previous_response_id, a function call asked for by name and its output sent back,
// retrieve and delete. Starts the server itself:
//   node tests/node/openai-responses.mjs TANDEM_BINARY MODEL.gguf
// Exit 0 when every check holds, 1 otherwise; 77 (skipped) when the SDK is not installed (npm ci here).
import { startTandem, checker } from './tandem-server.mjs'
import assert from 'node:assert/strict'

let OpenAI
try {
  ;({ default: OpenAI } = await import('openai'))
} catch {
  console.log('skipped: the openai package is not installed (cd tests/node && npm ci)')
  process.exit(77)
}

const [tandem, model] = process.argv.slice(2)
const { host, server } = await startTandem(tandem, model, ['--parallel', '2', '--alias', 'stories', '-c', '4096'])
const { check, finish } = checker()
const client = new OpenAI({ baseURL: `${host}/v1`, apiKey: 'unused', maxRetries: 0 })
const greedy = { model: 'stories', temperature: 0 }

await check('responses.create gives output_text; streamed events and the stream helper give the same', async () => {
  const req = { ...greedy, input: 'Once upon a time', max_output_tokens: 24 }
  const whole = await client.responses.create(req)
  assert.equal(whole.object, 'response')
  assert.match(whole.id, /^resp_/)
  assert.ok(whole.output_text.length > 0)
  assert.ok(['completed', 'incomplete'].includes(whole.status))
  assert.equal(whole.usage.output_tokens > 0, true)

  let text = ''
  let last = null
  const types = []
  for await (const event of await client.responses.create({ ...req, stream: true })) {
    types.push(event.type)
    if (event.type === 'response.output_text.delta') text += event.delta
    last = event
  }
  assert.equal(text, whole.output_text)
  assert.equal(types[0], 'response.created')
  assert.equal(last.type, whole.status === 'completed' ? 'response.completed' : 'response.incomplete')
  assert.equal(last.response.output[0].content[0].text, whole.output_text)

  // The SDK's stream helper rebuilds the response from the events (it needs them in the API's order).
  const helper = client.responses.stream(req)
  let helped = ''
  helper.on('response.output_text.delta', (e) => (helped += e.delta))
  const final = await helper.finalResponse()
  // (Its final status is the last response.completed's: a reply cut by max_output_tokens ends with
  // response.incomplete, as OpenAI's does, which the helper leaves at its in_progress snapshot.)
  assert.equal(helped, whole.output_text)
  assert.equal(final.output[0].content[0].text, whole.output_text)
})

await check('previous_response_id continues the conversation; retrieve and delete', async () => {
  const first = await client.responses.create({ ...greedy, input: 'Lily had a ball.', max_output_tokens: 12 })
  const second = await client.responses.create({
    ...greedy,
    input: 'What next?',
    previous_response_id: first.id,
    max_output_tokens: 12,
  })
  const chat = await client.chat.completions.create({
    ...greedy,
    max_tokens: 12,
    messages: [
      { role: 'user', content: 'Lily had a ball.' },
      { role: 'assistant', content: first.output_text },
      { role: 'user', content: 'What next?' },
    ],
  })
  assert.equal(second.output_text, chat.choices[0].message.content)
  const got = await client.responses.retrieve(first.id)
  assert.equal(got.id, first.id)
  assert.equal(got.output_text, first.output_text)
  await client.responses.delete(first.id)
  await assert.rejects(client.responses.retrieve(first.id), (e) => e.status === 404)
})

await check('a function call asked for by name, and its output sent back', async () => {
  const tools = [
    {
      type: 'function',
      name: 'get_weather',
      description: 'Weather in a city',
      parameters: {
        type: 'object',
        properties: { city: { type: 'string', maxLength: 12 } },
        required: ['city'],
        additionalProperties: false,
      },
      strict: true,
    },
  ]
  const r = await client.responses.create({
    ...greedy,
    input: 'Weather in Paris?',
    tools,
    tool_choice: { type: 'function', name: 'get_weather' },
    max_output_tokens: 80,
  })
  const call = r.output.find((item) => item.type === 'function_call')
  assert.ok(call, JSON.stringify(r.output))
  assert.equal(call.name, 'get_weather')
  assert.equal(typeof JSON.parse(call.arguments).city, 'string')
  const next = await client.responses.create({
    ...greedy,
    previous_response_id: r.id,
    input: [{ type: 'function_call_output', call_id: call.call_id, output: '21C and sunny' }],
    tools,
    tool_choice: 'none',
    max_output_tokens: 16,
  })
  assert.equal(next.output[0].type, 'message')
  assert.ok(next.output_text.length > 0)
})

await check("the SDK's errors carry the server's 400 and 404", async () => {
  await assert.rejects(
    client.responses.create({ ...greedy, input: [{ role: 'user', content: [{ type: 'input_image', image_url: 'x' }] }] }),
    (e) => e.status === 400 && /input_image/.test(e.message),
  )
  await assert.rejects(
    client.responses.create({ ...greedy, input: 'x', previous_response_id: 'resp_nothing' }),
    (e) => e.status === 404,
  )
})

finish(server)

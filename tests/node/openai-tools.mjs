// The official `openai` JavaScript SDK (npm) against `tandem serve`: a tool-calling round trip (tools ->
// tool_calls -> role "tool" -> answer), not streamed and streamed, plus the SDK's own errors, models.retrieve,
// logit_bias / ignore_eos as the SDK sends them, n choices gathered by the SDK's stream helper, and
// embeddings (base64, as the SDK asks for them). Starts
// the server itself:
//   node tests/node/openai-tools.mjs TANDEM_BINARY MODEL.gguf
// The test model (stories260K) tells stories, not function calls, so the call is asked for by name
// (tool_choice): the reply is then constrained to a call with the tool's parameters, which is the path a
// real model takes too. Exit 0 when every check holds, 1 otherwise; 77 (skipped) when the SDK is not
// installed (npm ci here).
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
const { host, server } = await startTandem(tandem, model, ['--parallel', '2', '--alias', 'stories'])
const { check, finish } = checker()
const client = new OpenAI({ baseURL: `${host}/v1`, apiKey: 'unused', maxRetries: 0 })

const tools = [
  {
    type: 'function',
    function: {
      name: 'get_weather',
      description: 'Weather in a city',
      parameters: {
        type: 'object',
        properties: { city: { type: 'string', maxLength: 12 }, unit: { type: 'string', enum: ['C', 'F'] } },
        required: ['city', 'unit'],
      },
    },
  },
  {
    type: 'function',
    function: { name: 'add', parameters: { type: 'object', properties: { a: { type: 'integer' }, b: { type: 'integer' } } } },
  },
]
const ask = [{ role: 'user', content: 'Weather in Paris?' }]
const callWeather = { type: 'function', function: { name: 'get_weather' } }
const greedy = { model: 'stories', temperature: 0 }

// Reads a streamed reply as SDK users do: content concatenated, tool_calls merged by index.
async function readStream(stream) {
  let content = ''
  let finish = null
  const calls = []
  for await (const chunk of stream) {
    const choice = chunk.choices[0]
    if (!choice) continue
    if (choice.delta?.content) content += choice.delta.content
    for (const d of choice.delta?.tool_calls ?? []) {
      calls[d.index] ??= { id: '', type: 'function', function: { name: '', arguments: '' } }
      if (d.id) calls[d.index].id = d.id
      if (d.function?.name) calls[d.index].function.name += d.function.name
      if (d.function?.arguments) calls[d.index].function.arguments += d.function.arguments
    }
    if (choice.finish_reason) finish = choice.finish_reason
  }
  return { content, finish, calls }
}

function checkWeatherCall(call) {
  assert.equal(call.type, 'function')
  assert.equal(call.function.name, 'get_weather')
  assert.match(call.id, /^call_[A-Za-z0-9]{24}$/)
  const args = JSON.parse(call.function.arguments)
  assert.deepEqual(Object.keys(args).sort(), ['city', 'unit'])
  assert.equal(typeof args.city, 'string')
  assert.ok(args.city.length <= 12)
  assert.ok(['C', 'F'].includes(args.unit))
  return args
}

let firstCall
await check('tools -> tool_calls, not streamed', async () => {
  const r = await client.chat.completions.create({ ...greedy, messages: ask, tools, tool_choice: callWeather, max_tokens: 80 })
  const choice = r.choices[0]
  assert.equal(choice.finish_reason, 'tool_calls')
  assert.equal(choice.message.role, 'assistant')
  assert.equal(choice.message.content, null)
  assert.equal(choice.message.tool_calls.length, 1)
  checkWeatherCall(choice.message.tool_calls[0])
  firstCall = choice.message
})

await check('tools -> tool_calls, streamed as delta.tool_calls', async () => {
  const s = await client.chat.completions.create({ ...greedy, messages: ask, tools, tool_choice: callWeather, max_tokens: 80, stream: true })
  const r = await readStream(s)
  assert.equal(r.finish, 'tool_calls')
  assert.equal(r.content, '')
  assert.equal(r.calls.length, 1)
  checkWeatherCall(r.calls[0])
  // Greedy: the same call as the whole reply.
  assert.equal(r.calls[0].function.arguments, firstCall.tool_calls[0].function.arguments)
})

await check('tool_choice "required" with one tool gives a call', async () => {
  const r = await client.chat.completions.create({ ...greedy, messages: ask, tools: tools.slice(0, 1), tool_choice: 'required', max_tokens: 80 })
  assert.equal(r.choices[0].finish_reason, 'tool_calls')
  checkWeatherCall(r.choices[0].message.tool_calls[0])
})

let answer
await check('role "tool" result -> an answer, not streamed', async () => {
  const call = firstCall.tool_calls[0]
  const messages = [...ask, firstCall, { role: 'tool', tool_call_id: call.id, content: '{"temperature": 21}' }]
  const r = await client.chat.completions.create({ ...greedy, messages, tools, max_tokens: 16 })
  const choice = r.choices[0]
  assert.ok(['stop', 'length'].includes(choice.finish_reason), choice.finish_reason)
  assert.equal(typeof choice.message.content, 'string')
  assert.ok(choice.message.content.length > 0)
  assert.equal(choice.message.tool_calls, undefined)
  // The call and its result are in the prompt: it is longer than the question alone.
  const plain = await client.chat.completions.create({ ...greedy, messages: ask, tools, max_tokens: 1 })
  assert.ok(r.usage.prompt_tokens > plain.usage.prompt_tokens + 10, `${r.usage.prompt_tokens} vs ${plain.usage.prompt_tokens}`)
  answer = { messages, content: choice.message.content }
})

await check('role "tool" result -> the same answer, streamed', async () => {
  const s = await client.chat.completions.create({ ...greedy, messages: answer.messages, tools, max_tokens: 16, stream: true })
  const r = await readStream(s)
  assert.equal(r.calls.length, 0)
  assert.equal(r.content, answer.content)
})

await check('a tool_choice naming no tool is a 400 the SDK reports', async () => {
  await assert.rejects(
    client.chat.completions.create({ ...greedy, messages: ask, tools, tool_choice: { type: 'function', function: { name: 'nope' } } }),
    (e) => {
      assert.equal(e.status, 400)
      assert.match(e.message, /nope/)
      return true
    },
  )
})

await check('models.list and models.retrieve name the served model; another is a 404', async () => {
  const list = await client.models.list()
  assert.deepEqual(list.data.map((m) => m.id), ['stories'])
  const m = await client.models.retrieve('stories')
  assert.equal(m.id, 'stories')
  assert.equal(m.object, 'model')
  await assert.rejects(client.models.retrieve('gpt-4'), (e) => {
    assert.equal(e.status, 404)
    return true
  })
})

await check('logit_bias and ignore_eos through the SDK: the end of text pushed up, then banned again', async () => {
  const base = { model: 'stories', prompt: 'Once upon a time', max_tokens: 12, temperature: 0 }
  const plain = await client.completions.create(base)
  const ended = await client.completions.create({ ...base, logit_bias: { 2: 100 } })
  assert.equal(ended.choices[0].text, '')
  assert.equal(ended.choices[0].finish_reason, 'stop')
  const runs = await client.completions.create({ ...base, logit_bias: { 2: 100 }, ignore_eos: true })
  assert.equal(runs.choices[0].text, plain.choices[0].text)
  assert.equal(runs.choices[0].finish_reason, 'length')
})

await check('n choices: the SDK gathers a streamed reply per choice, equal to the reply not streamed', async () => {
  const req = { model: 'stories', messages: ask, max_tokens: 10, temperature: 1.5, top_p: 1, seed: 11, n: 2 }
  const whole = await client.chat.completions.create(req)
  assert.deepEqual(whole.choices.map((c) => c.index), [0, 1])
  assert.notEqual(whole.choices[0].message.content, whole.choices[1].message.content)
  // The SDK's stream helper builds each choice from the chunks that name its index.
  const gathered = await client.chat.completions.stream(req).finalChatCompletion()
  assert.deepEqual(
    gathered.choices.map((c) => [c.index, c.message.content, c.finish_reason]),
    whole.choices.map((c) => [c.index, c.message.content, c.finish_reason]),
  )
  assert.equal(whole.usage.completion_tokens, 20)
  // With a tool asked for, every choice is a call of its own; streamed, each choice's call comes whole.
  const calls = { ...req, tools, tool_choice: callWeather, max_tokens: 80 }
  const called = await client.chat.completions.create(calls)
  const streamed = await client.chat.completions.stream(calls).finalChatCompletion()
  for (const reply of [called, streamed]) {
    assert.deepEqual(reply.choices.map((c) => [c.index, c.finish_reason]), [[0, 'tool_calls'], [1, 'tool_calls']])
    for (const c of reply.choices) checkWeatherCall(c.message.tool_calls[0])
  }
  assert.deepEqual(
    streamed.choices.map((c) => c.message.tool_calls[0].function.arguments),
    called.choices.map((c) => c.message.tool_calls[0].function.arguments),
  )
})

await check('embeddings.create decodes the base64 the SDK asks for into the float vectors', async () => {
  const input = ['Once upon a time', 'The end']
  const viaSdk = await client.embeddings.create({ model: 'stories', input })  // encoding_format base64 by default
  const floats = await fetch(`${host}/v1/embeddings`, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ model: 'stories', input, encoding_format: 'float' }),
  }).then((x) => x.json())
  assert.equal(viaSdk.data.length, 2)
  for (let i = 0; i < 2; i++) {
    assert.equal(viaSdk.data[i].index, i)
    assert.deepEqual(Array.from(viaSdk.data[i].embedding), floats.data[i].embedding.map(Math.fround))
  }
  assert.equal(viaSdk.usage.prompt_tokens, floats.usage.prompt_tokens)
})

finish(server)

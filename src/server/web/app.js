// tandem's dashboard: a chat page over /v1/chat/completions (streamed) and a cluster page over /status, polled
// once a second. Plain browser JavaScript, no libraries, served from the binary (src/server/web).
'use strict'

const $ = (sel) => document.querySelector(sel)
const HISTORY = 120 // chart samples kept (one per poll)
const POLL_MS = 1000

const state = {
  key: localStorage.getItem('tandem.apiKey') || '',
  samples: [], // {t, tps, queue, active}
  prev: null, // the previous /status, for rates
  messages: [], // the conversation: {role, content}
  abort: null, // the running chat request's AbortController
}

// ---- formatting ----------------------------------------------------------------------------------------

function bytes(n) {
  if (!n) return '0 B'
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB']
  let i = 0
  while (n >= 1024 && i < units.length - 1) {
    n /= 1024
    i++
  }
  return `${n < 10 && i > 0 ? n.toFixed(1) : Math.round(n)} ${units[i]}`
}

function seconds(s) {
  if (!s) return '-'
  if (s < 1e-3) return `${(s * 1e6).toFixed(0)} µs`
  if (s < 1) return `${(s * 1e3).toFixed(s < 0.01 ? 2 : 1)} ms`
  if (s < 120) return `${s.toFixed(1)} s`
  if (s < 7200) return `${Math.floor(s / 60)} min`
  return `${(s / 3600).toFixed(1)} h`
}

function number(x, digits = 1) {
  return x === undefined || x === null ? '-' : Number(x).toFixed(digits)
}

// A table row of text cells (textContent: nothing a node reports becomes markup).
function row(cells) {
  const tr = document.createElement('tr')
  for (const c of cells) {
    const td = document.createElement('td')
    td.textContent = c
    tr.appendChild(td)
  }
  return tr
}

// ---- the API -------------------------------------------------------------------------------------------

function headers(extra = {}) {
  const h = { ...extra }
  if (state.key) h.Authorization = `Bearer ${state.key}`
  return h
}

async function api(path, options = {}) {
  const r = await fetch(path, { ...options, headers: headers(options.headers) })
  if (r.status === 401) {
    $('#auth').hidden = false
    throw new Error('this server needs its API key (enter it above)')
  }
  return r
}

function setKey(key) {
  state.key = key.trim()
  if (state.key) localStorage.setItem('tandem.apiKey', state.key)
  else localStorage.removeItem('tandem.apiKey')
  $('#p-key').value = state.key
  $('#auth').hidden = true
  loadModels()
  poll()
}

// ---- pages ---------------------------------------------------------------------------------------------

function route() {
  const page = location.hash === '#cluster' ? 'cluster' : 'chat'
  $('#page-chat').hidden = page !== 'chat'
  $('#page-cluster').hidden = page !== 'cluster'
  $('#tab-chat').classList.toggle('active', page === 'chat')
  $('#tab-cluster').classList.toggle('active', page === 'cluster')
  if (page === 'chat') $('#prompt').focus()
}

// ---- cluster page --------------------------------------------------------------------------------------

// Draws series (each {values, cls}) as lines over the last HISTORY samples into an SVG; returns the top value.
function chart(svg, series) {
  const W = 600
  const H = 160
  let max = 1
  for (const s of series) for (const v of s.values) max = Math.max(max, v)
  max = niceCeil(max)
  while (svg.firstChild) svg.removeChild(svg.firstChild)
  const ns = 'http://www.w3.org/2000/svg'
  for (let i = 1; i < 4; i++) {
    const g = document.createElementNS(ns, 'line')
    g.setAttribute('x1', 0)
    g.setAttribute('x2', W)
    g.setAttribute('y1', (H * i) / 4)
    g.setAttribute('y2', (H * i) / 4)
    g.setAttribute('class', 'grid')
    svg.appendChild(g)
  }
  for (const s of series) {
    if (s.values.length === 0) continue
    const step = W / (HISTORY - 1)
    const x0 = W - step * (s.values.length - 1)
    const pts = s.values.map((v, i) => `${(x0 + i * step).toFixed(1)},${(H - (v / max) * (H - 4) - 2).toFixed(1)}`)
    const line = document.createElementNS(ns, 'polyline')
    line.setAttribute('points', pts.join(' '))
    line.setAttribute('class', `line ${s.cls}`)
    svg.appendChild(line)
  }
  const last = series[0].values
  svg.dataset.points = String(last.length)
  svg.dataset.last = String(last.length ? last[last.length - 1] : 0)
  svg.dataset.max = String(max)
  return max
}

function niceCeil(x) {
  const p = Math.pow(10, Math.floor(Math.log10(x)))
  for (const m of [1, 2, 5, 10]) if (x <= m * p) return m * p
  return 10 * p
}

function renderStatus(st) {
  const s = st.server || {}
  const health = $('#health')
  health.textContent = st.status === 'ok' ? 'healthy' : st.status
  health.className = `badge ${st.status}`
  health.title = st.message || ''
  $('#model-name').textContent = st.model || ''
  $('#c-tps').textContent = number(s.tokens_per_second)
  $('#c-queue').textContent = s.queue_depth ?? '-'
  $('#c-slots').textContent = s.slots_total ? `${s.slots_active} / ${s.slots_total}` : '-'
  $('#c-kv').textContent = s.kv_pool ? `${s.kv_used} / ${s.kv_pool}` : `${s.kv_used ?? '-'}`
  $('#c-generated').textContent = s.generated_tokens ?? '-'
  const fin = s.requests_finished || {}
  $('#c-requests').textContent = `${(fin.stop || 0) + (fin.length || 0)} / ${fin.error || 0}`
  $('#c-ttft').textContent = seconds(s.ttft_seconds_mean)
  $('#c-uptime').textContent = seconds(st.uptime_seconds)
  $('#layout').textContent = st.layout || 'one machine'

  state.samples.push({ t: Date.now(), tps: s.tokens_per_second || 0, queue: s.queue_depth || 0, active: s.slots_active || 0 })
  if (state.samples.length > HISTORY) state.samples.shift()
  const top = chart($('#chart-tps'), [{ values: state.samples.map((x) => x.tps), cls: 'tps' }])
  $('#chart-tps-max').textContent = `(top ${top})`
  const qtop = chart($('#chart-queue'), [
    { values: state.samples.map((x) => x.queue), cls: 'queue' },
    { values: state.samples.map((x) => x.active), cls: 'active' },
  ])
  $('#chart-queue-max').textContent = `(top ${qtop})`

  const engine = st.engine || { nodes: [], links: [] }
  const prev = state.prev && state.prev.engine ? state.prev : null
  const dt = prev ? (st.uptime_seconds - prev.uptime_seconds) : 0
  const prevNode = (addr) => (prev ? prev.engine.nodes.find((n) => n.address === addr) : null)
  const nodes = $('#nodes tbody')
  nodes.replaceChildren()
  for (const n of engine.nodes) {
    const p = prevNode(n.address)
    const busy = p && dt > 0 ? Math.min(1, (n.compute_seconds - p.compute_seconds) / dt) : null
    const role = n.tp_size > 1 ? `stage ${n.stage + 1}, rank ${n.rank + 1} of ${n.tp_size}` : `stage ${n.stage + 1}`
    const tr = row([
      n.name && n.name !== n.address ? `${n.address} (${n.name})` : n.address,
      role,
      `${n.layers[0]}-${n.layers[1]}`,
      `${n.threads || '-'} threads${n.gflops ? `, ${Math.round(n.gflops)} GFLOP/s` : ''}`,
      n.mem_total ? `${bytes(n.mem_available)} / ${bytes(n.mem_total)}` : '-',
      n.weight_bytes !== undefined ? bytes(n.weight_bytes) : '-',
      n.kv_bytes !== undefined ? bytes(n.kv_bytes) : '-',
      n.links || '-',
      seconds(n.step_latency_seconds),
      busy === null ? '-' : `${Math.round(busy * 100)}%`,
      n.forward_steps ?? '-',
    ])
    tr.title = n.cpu || ''
    tr.dataset.address = n.address
    nodes.appendChild(tr)
  }
  const links = $('#links tbody')
  links.replaceChildren()
  for (const l of engine.links) {
    const p = prev ? prev.engine.links.find((x) => x.from === l.from && x.to === l.to) : null
    const rate = p && dt > 0 ? (l.bytes - p.bytes) / dt : null
    links.appendChild(row([l.from, l.to, l.messages, bytes(l.bytes), rate === null ? '-' : `${bytes(rate)}/s`,
      seconds(l.send_latency_seconds)]))
  }
  if (engine.links.length === 0) links.appendChild(row(['-', '-', '-', '-', '-', '-']))

  const faults = []
  if (st.status === 'error') faults.push(`engine failing: ${st.message}`)
  for (const r of st.recoveries || []) faults.push(`recovered: ${r}`)
  if (fin.error) faults.push(`${fin.error} requests ended with an error`)
  if (s.requests_resumed) faults.push(`${s.requests_resumed} requests resumed after a lost node`)
  if (s.http_errors) faults.push(`${s.http_errors} HTTP answers with a server error (5xx)`)
  if (s.preemptions) faults.push(`${s.preemptions} requests preempted (the KV pool ran out)`)
  const list = $('#faults')
  list.replaceChildren()
  for (const f of faults.length ? faults : ['none']) {
    const li = document.createElement('li')
    li.textContent = f
    if (f !== 'none') li.className = 'fault'
    list.appendChild(li)
  }
  state.prev = st
}

let polling = false
async function poll() {
  if (polling) return
  polling = true
  try {
    const r = await api('/status')
    if (r.ok) renderStatus(await r.json())
  } catch (e) {
    const h = $('#health')
    h.textContent = 'unreachable'
    h.className = 'badge error'
    h.title = String(e.message || e)
  } finally {
    polling = false
  }
}

// ---- chat page -----------------------------------------------------------------------------------------

async function loadModels() {
  try {
    const r = await api('/v1/models')
    if (!r.ok) return
    const j = await r.json()
    const sel = $('#p-model')
    sel.replaceChildren()
    for (const m of j.data || []) {
      const o = document.createElement('option')
      o.value = m.id
      o.textContent = m.meta && m.meta.n_ctx_slot ? `${m.id} (${m.meta.n_ctx_slot} positions)` : m.id
      sel.appendChild(o)
    }
  } catch (e) {
    // the key banner says what is missing
  }
}

function addMessage(role, text) {
  const div = document.createElement('div')
  div.className = `msg ${role}`
  div.textContent = text
  $('#chat-log').appendChild(div)
  div.scrollIntoView({ block: 'end' })
  return div
}

function params() {
  const body = {
    model: $('#p-model').value || undefined,
    temperature: Number($('#p-temperature').value),
    top_p: Number($('#p-top-p').value),
    max_tokens: Number($('#p-max-tokens').value),
    stream: true,
    stream_options: { include_usage: true },
  }
  const seed = $('#p-seed').value
  if (seed !== '') body.seed = Number(seed)
  return body
}

// Sends the conversation and streams the answer into a new assistant message; its data-chunks counts the
// events that carried text, data-done is set when the stream ended.
async function send(text) {
  if (state.abort) return
  state.messages.push({ role: 'user', content: text })
  addMessage('user', text)
  const out = addMessage('assistant', '')
  out.classList.add('streaming')
  out.dataset.chunks = '0'
  const system = $('#p-system').value.trim()
  const messages = system ? [{ role: 'system', content: system }, ...state.messages] : state.messages
  state.abort = new AbortController()
  $('#send').disabled = true
  $('#stop').disabled = false
  const t0 = performance.now()
  let tFirst = 0
  let answer = ''
  let usage = null
  try {
    const r = await api('/v1/chat/completions', {
      method: 'POST',
      headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify({ ...params(), messages }),
      signal: state.abort.signal,
    })
    if (!r.ok) {
      const j = await r.json().catch(() => ({}))
      throw new Error((j.error && j.error.message) || `HTTP ${r.status}`)
    }
    const reader = r.body.getReader()
    const decoder = new TextDecoder()
    let buf = ''
    for (;;) {
      const { value, done } = await reader.read()
      if (done) break
      buf += decoder.decode(value, { stream: true })
      let at
      while ((at = buf.indexOf('\n\n')) >= 0) {
        const event = buf.slice(0, at)
        buf = buf.slice(at + 2)
        for (const line of event.split('\n')) {
          if (!line.startsWith('data: ')) continue
          const data = line.slice(6)
          if (data === '[DONE]') continue
          const j = JSON.parse(data)
          if (j.error) throw new Error(j.error.message || String(j.error))
          if (j.usage) usage = j.usage
          const delta = j.choices && j.choices[0] && j.choices[0].delta
          if (delta && delta.content) {
            if (!tFirst) tFirst = performance.now()
            answer += delta.content
            out.textContent = answer
            out.dataset.chunks = String(Number(out.dataset.chunks) + 1)
            out.scrollIntoView({ block: 'end' })
          }
        }
      }
    }
    state.messages.push({ role: 'assistant', content: answer })
    const n = usage ? usage.completion_tokens : 0
    const secs = (performance.now() - (tFirst || t0)) / 1000
    $('#chat-stats').textContent = n
      ? `${n} tokens, ${(n / Math.max(secs, 1e-3)).toFixed(1)} tokens/s, first after ${seconds((tFirst - t0) / 1000)}`
      : ''
  } catch (e) {
    if (e.name === 'AbortError') {
      state.messages.push({ role: 'assistant', content: answer })
      $('#chat-stats').textContent = 'stopped'
    } else {
      state.messages.pop()
      addMessage('error', String(e.message || e))
    }
  } finally {
    out.classList.remove('streaming')
    out.dataset.done = '1'
    state.abort = null
    $('#send').disabled = false
    $('#stop').disabled = true
  }
}

// ---- start ---------------------------------------------------------------------------------------------

window.addEventListener('hashchange', route)
$('#chat-form').addEventListener('submit', (e) => {
  e.preventDefault()
  const text = $('#prompt').value.trim()
  if (!text) return
  $('#prompt').value = ''
  send(text)
})
$('#prompt').addEventListener('keydown', (e) => {
  if (e.key === 'Enter' && !e.shiftKey) {
    e.preventDefault()
    $('#chat-form').requestSubmit()
  }
})
$('#stop').addEventListener('click', () => state.abort && state.abort.abort())
$('#clear').addEventListener('click', () => {
  if (state.abort) state.abort.abort()
  state.messages = []
  $('#chat-log').replaceChildren()
  $('#chat-stats').textContent = ''
})
$('#auth-save').addEventListener('click', () => setKey($('#auth-key').value))
$('#p-key').addEventListener('change', () => setKey($('#p-key').value))
$('#p-key').value = state.key

route()
loadModels()
poll()
setInterval(poll, POLL_MS)

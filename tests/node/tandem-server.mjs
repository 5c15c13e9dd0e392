// Shared by the client-library tests: starts `tandem serve` on a free port and waits until it serves, and a
// tiny check runner.
import { spawn } from 'node:child_process'

// Starts `tandem serve -m MODEL --port 0 ...extra`; resolves to { host, server } once /health says 200.
export async function startTandem(tandem, model, extra = []) {
  const server = spawn(tandem, ['serve', '-m', model, '--port', '0', ...extra], { stdio: ['ignore', 'ignore', 'pipe'] })
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
  // The server needs a moment after "listening" before the model is attached.
  for (let i = 0; i < 100; i++) {
    const r = await fetch(`${host}/health`).catch(() => null)
    if (r && r.status === 200) break
    await new Promise((r) => setTimeout(r, 50))
  }
  return { host, server }
}

// check(name, async fn) runs and reports one check; finish(server) stops the server and exits 0 when all held.
export function checker() {
  let passed = 0
  let failed = 0
  return {
    async check(name, fn) {
      try {
        await fn()
        passed++
        console.log(`ok   ${name}`)
      } catch (e) {
        failed++
        console.log(`FAIL ${name}: ${e.stack || e}`)
      }
    },
    finish(server) {
      server.kill('SIGTERM')
      console.log(`${passed} passed, ${failed} failed`)
      process.exit(failed === 0 ? 0 : 1)
    },
  }
}

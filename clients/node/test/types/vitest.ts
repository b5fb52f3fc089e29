// A typed vitest use of the package (tsc --noEmit, test/types.test.mjs). What is marked as an
// expected error must stay one: the types are not `any`.
import { afterAll, afterEach, beforeAll, beforeEach, test } from 'vitest'
import pg from 'pg'
import {
  PgleaseClient, PgleaseError, PgleaseUnavailableError, cleanLabel, startPglease, useDatabase, useFileDatabase,
  type KeptDatabase, type Lease, type PgConfig, type PgleaseDaemon,
} from '@pglease/client'

const db = useDatabase({ template: 'app', keepFailed: 600, hooks: { beforeEach, afterEach } })
const shared = useFileDatabase({ template: 'app', keepFailed: true, hooks: { beforeAll, afterAll } })

test('typed', async () => {
  const config: PgConfig = db.config
  const client = new pg.Client(config)
  const url: string = shared.url
  const port: number = db.port
  // @ts-expect-error the database is read-only
  db.url = 'postgres://elsewhere'
  // @ts-expect-error no such field
  db.dsn
  await client.end()
  return { url, port }
})

async function direct(): Promise<KeptDatabase[]> {
  const client = new PgleaseClient({ url: 'http://127.0.0.1:5480', token: 'secret' })
  const lease: Lease = await client.lease({ template: 'app', ttlSecs: 60, waitMs: 1000, maxConnections: 5, postgresVersion: 17, label: cleanLabel('x') })
  await client.renew(lease.id, 600)
  await client.release(lease.id, { keepSecs: 60 })
  // @ts-expect-error keepSecs is a number of seconds
  await client.release(lease.id, { keepSecs: '60' })
  // @ts-expect-error ttlSecs, not ttl_secs
  await client.lease({ ttl_secs: 60 })
  const status = await client.status()
  const labels: (string | null)[] = status.leases.map((l) => l.label)
  try {
    await client.lease()
  } catch (error) {
    if (error instanceof PgleaseError) return [error.status, error.code, error.detail, labels] as never
    if (error instanceof PgleaseUnavailableError) return [error.url] as never
  }
  return client.kept()
}

// A globalSetup file's default export, as the README shows it.
export default async function setup(): Promise<() => Promise<void>> {
  const daemon: PgleaseDaemon = await startPglease({ serveArgs: ['--template', 'app=migrations:db'], readyTimeoutMs: 60_000 })
  const url: string = daemon.url
  const started: boolean = daemon.started
  void [url, started]
  // @ts-expect-error serveArgs is a list of arguments, not one string
  await startPglease({ serveArgs: '--template app=migrations:db' })
  return daemon.stop
}

// @ts-expect-error keepFailed takes seconds or a boolean
useDatabase({ keepFailed: '600' })

export { direct }

// Type-checks a typical use (tsc --noEmit): wrong shapes fail the build.
import { PgleaseClient, PgleaseError, useDatabase, type Lease } from '../index.js'

const db = useDatabase({ template: 'app', keepFailed: 600 })
const host: string | undefined = db.config?.host
const client = new PgleaseClient({ url: 'http://127.0.0.1:5480' })
async function use(): Promise<Lease> {
  const lease = await client.lease({ template: 'app', label: 'x', waitMs: 1000 })
  await client.release(lease.id, { keepSecs: 60 })
  return lease
}
export { host, use, PgleaseError }

// A typed jest use in CommonJS (tsc --noEmit): require's types are the same declarations.
import { beforeEach, afterEach } from '@jest/globals'
import { useDatabase, type PgConfig } from '@pglease/client'

const db = useDatabase({ template: 'app', hooks: { beforeEach, afterEach } })
export const config = (): PgConfig => db.config

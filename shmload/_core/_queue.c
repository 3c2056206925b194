/* The control queue's two ends in C: control.py's Producer.put and Consumer.take, the
 * per-batch messages of both processes (a task out of the main process, a completion out
 * of a worker), about 4 and 3 us each in Python and a tenth of that here.
 *
 * The same queue, byte for byte, as control.py's Python ends, so either end may be
 * either kind: a record is a little-endian uint32 length and the payload, padded to 8
 * bytes; a record never wraps (a length of 0xFFFFFFFF says "the next record starts at
 * offset 0"). The synchronisation is control.py's NOTE [ How a record becomes visible ]:
 * the writer posts ``items`` after the record's bytes are stored and overwrites a
 * record's bytes only after a ``free`` token for it; the reader copies a record out only
 * after taking an ``items`` token and posts ``free`` after the copy. A failure is the
 * Python end's: False for no room, None for no record, OSError from sem_post.
 *
 * Memory safety: an end holds a buffer export of the mapping (so the mapping cannot be
 * unmapped under it) until close(); its offsets are checked against the mapping once,
 * at construction; every write and read is checked against the data area before it is
 * made (a corrupt length raises ValueError instead of reading past the area). No call
 * blocks: waiting stays in Python (control.py), which releases the GIL around it.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <semaphore.h>
#include <stdalign.h>
#include <stdint.h>
#include <string.h>

#include "_native.h"

#define WRAP 0xFFFFFFFFu
#define HEADER ((Py_ssize_t)4)
#define PADDED(n) (((n) + 7) & ~(Py_ssize_t)7)
#define SMALL_PARTS 8

typedef struct {
    PyObject_HEAD
    Py_buffer view; /* the mapping: exported while open */
    int open;
    char *data;     /* the data area */
    Py_ssize_t cap; /* its bytes */
    sem_t *items, *free;
    Py_ssize_t pos;
    /* the writer's own: bytes not yet freed, and the span of each unfreed record, oldest
     * first (a ring of ``room`` entries from ``head``) */
    Py_ssize_t used;
    Py_ssize_t *spans, room, head, count;
} End;

static void
put_le32(char *at, uint32_t v)
{
    unsigned char b[4] = {v & 0xFF, (v >> 8) & 0xFF, (v >> 16) & 0xFF, (v >> 24) & 0xFF};
    memcpy(at, b, 4);
}

static uint32_t
get_le32(const char *at)
{
    unsigned char b[4];
    memcpy(b, at, 4);
    return (uint32_t)b[0] | ((uint32_t)b[1] << 8) | ((uint32_t)b[2] << 16) | ((uint32_t)b[3] << 24);
}

static sem_t *
semaphore_at(End *self, Py_ssize_t offset, const char *name)
{
    char *at = (char *)self->view.buf + offset;
    if (offset < 0 || offset > self->view.len - (Py_ssize_t)sizeof(sem_t) ||
        (uintptr_t)at % alignof(sem_t) != 0) {
        PyErr_Format(PyExc_ValueError, "the %s semaphore at offset %zd is not within the mapping, aligned", name,
                     offset);
        return NULL;
    }
    return (sem_t *)at;
}

/* End(mapping, data, capacity, items, free): the offsets of the data area and of its two
 * semaphores in ``mapping`` (a writable buffer, the control segment's mmap). */
static int
End_init(End *self, PyObject *args, PyObject *kwds)
{
    PyObject *mapping;
    Py_ssize_t data, cap, items, free;
    if (self->open) {
        PyErr_SetString(PyExc_RuntimeError, "a queue end is made once");
        return -1;
    }
    if (!PyArg_ParseTuple(args, "Onnnn", &mapping, &data, &cap, &items, &free))
        return -1;
    if (PyObject_GetBuffer(mapping, &self->view, PyBUF_WRITABLE) < 0)
        return -1;
    self->open = 1;
    if (cap < 16 || cap % 8 != 0 || cap > (Py_ssize_t)WRAP || data < 0 || data > self->view.len - cap) {
        PyErr_Format(PyExc_ValueError, "a data area of %zd bytes at offset %zd is not within a mapping of %zd bytes "
                     "(or not a multiple of 8 of at least 16)", cap, data, self->view.len);
        return -1;
    }
    self->data = (char *)self->view.buf + data;
    self->cap = cap;
    if ((self->items = semaphore_at(self, items, "items")) == NULL ||
        (self->free = semaphore_at(self, free, "free")) == NULL)
        return -1;
    self->pos = self->used = self->head = self->count = 0;
    return 0;
}

static int
check_open(End *self)
{
    if (!self->open || self->data == NULL) {
        PyErr_SetString(PyExc_ValueError, "this queue end is closed");
        return -1;
    }
    return 0;
}

static void
End_release(End *self)
{
    if (self->open) {
        PyBuffer_Release(&self->view);
        self->open = 0;
    }
    self->data = NULL;
    PyMem_Free(self->spans);
    self->spans = NULL;
    self->room = self->count = self->head = 0;
}

static void
End_dealloc(End *self)
{
    End_release(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
End_close(End *self, PyObject *unused)
{
    End_release(self);
    Py_RETURN_NONE;
}

static PyObject *
End_reset(End *self, PyObject *unused)
{
    if (check_open(self) < 0)
        return NULL;
    self->pos = self->used = self->head = self->count = 0;
    Py_RETURN_NONE;
}

/* ---------------------------------------------------------------- the writer */
static int
spans_push(End *self, Py_ssize_t span)
{
    if (self->count == self->room) {
        Py_ssize_t room = self->room ? 2 * self->room : 64;
        Py_ssize_t *grown = PyMem_New(Py_ssize_t, room);
        if (grown == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        for (Py_ssize_t i = 0; i < self->count; i++)
            grown[i] = self->spans[(self->head + i) % self->room];
        PyMem_Free(self->spans);
        self->spans = grown;
        self->room = room;
        self->head = 0;
    }
    self->spans[(self->head + self->count) % self->room] = span;
    self->count++;
    return 0;
}

/* The oldest unfreed record's span is free again (its token was taken). */
static int
spans_pop(End *self)
{
    if (self->count == 0) {
        PyErr_SetString(PyExc_RuntimeError, "a free token for a record this queue end never wrote");
        return -1;
    }
    self->used -= self->spans[self->head];
    self->head = (self->head + 1) % self->room;
    self->count--;
    return 0;
}

/* OSError(errno, "<call>: <strerror>"), as queues._checked raises it; NULL. */
static PyObject *
errno_error(const char *call)
{
    int err = errno;
    PyObject *args = Py_BuildValue("(iN)", err, PyUnicode_FromFormat("%s: %s", call, strerror(err)));
    if (args != NULL) {
        PyErr_SetObject(PyExc_OSError, args);
        Py_DECREF(args);
    }
    return NULL;
}

/* put(payload, *more) -> bool: control.Producer.put. */
static PyObject *
Writer_put(End *self, PyObject *args)
{
    if (check_open(self) < 0)
        return NULL;
    Py_ssize_t nparts = PyTuple_GET_SIZE(args);
    if (nparts < 1) {
        PyErr_SetString(PyExc_TypeError, "put() takes a payload");
        return NULL;
    }
    Py_buffer small[SMALL_PARTS], *parts = small;
    if (nparts > SMALL_PARTS && (parts = PyMem_New(Py_buffer, nparts)) == NULL)
        return PyErr_NoMemory();
    PyObject *result = NULL;
    Py_ssize_t got = 0, n = 0;
    for (; got < nparts; got++) {
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(args, got), &parts[got], PyBUF_SIMPLE) < 0)
            goto done;
        n += parts[got].len;
    }
    if (n >= (Py_ssize_t)WRAP) { /* (past what a length holds: never fits, no room as in Python) */
        result = Py_False;
        Py_INCREF(result);
        goto done;
    }
    Py_ssize_t need = HEADER + PADDED(n), pos = self->pos, cap = self->cap;
    Py_ssize_t span = pos + need <= cap ? need : cap - pos + need; /* a record never wraps: it skips the end */
    while (self->used + span > cap) {
        if (sem_trywait(self->free) != 0) {
            result = Py_False;
            Py_INCREF(result);
            goto done;
        }
        if (spans_pop(self) < 0)
            goto done;
    }
    if (span != need) {
        put_le32(self->data + pos, WRAP); /* (pos is 4 short of a multiple of 8, or less: 4 bytes remain) */
        pos = 0;
    }
    if (pos < 0 || pos + need > cap) { /* (cannot happen: the checks above) */
        PyErr_SetString(PyExc_RuntimeError, "a control record would overrun its queue");
        goto done;
    }
    if (spans_push(self, span) < 0)
        goto done;
    put_le32(self->data + pos, (uint32_t)n);
    char *at = self->data + pos + HEADER;
    for (Py_ssize_t i = 0; i < nparts; i++) {
        memcpy(at, parts[i].buf, (size_t)parts[i].len);
        at += parts[i].len;
    }
    self->pos = (pos + need) % cap;
    self->used += span;
    if (sem_post(self->items) != 0) { /* NOTE [ How a record becomes visible ] (control.py) */
        errno_error("sem_post");
        goto done;
    }
    result = Py_True;
    Py_INCREF(result);
done:
    for (Py_ssize_t i = 0; i < got; i++)
        PyBuffer_Release(&parts[i]);
    if (parts != small)
        PyMem_Free(parts);
    return result;
}

/* freed(): a free token was taken by a wait (control.Producer.wait_for_room). */
static PyObject *
Writer_freed(End *self, PyObject *unused)
{
    if (check_open(self) < 0 || spans_pop(self) < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* pending() -> int: records published and not yet taken (control.Producer.pending): the
 * count of ``items``, read after this end's own post, so it counts the record just put. */
static PyObject *
Writer_pending(End *self, PyObject *unused)
{
    if (check_open(self) < 0)
        return NULL;
    int value = 0;
    if (sem_getvalue(self->items, &value) != 0)
        return errno_error("sem_getvalue");
    return PyLong_FromLong(value);
}

/* ---------------------------------------------------------------- the reader */
/* read() -> bytes: the next record, whose items token the caller took (control.Consumer._read). */
static PyObject *
Reader_read(End *self, PyObject *unused)
{
    if (check_open(self) < 0)
        return NULL;
    Py_ssize_t pos = self->pos, cap = self->cap;
    if (pos < 0 || pos > cap - HEADER) {
        PyErr_Format(PyExc_ValueError, "control queue position %zd is outside its %zd bytes", pos, cap);
        return NULL;
    }
    uint32_t n = get_le32(self->data + pos);
    if (n == WRAP) {
        pos = 0;
        n = get_le32(self->data);
    }
    if ((Py_ssize_t)n > cap - pos - HEADER) {
        PyErr_Format(PyExc_ValueError, "a control record of %lu bytes at offset %zd overruns its queue of %zd bytes",
                     (unsigned long)n, pos, cap);
        return NULL;
    }
    /* a copy: the bytes are the producer's again after the post below */
    PyObject *record = PyBytes_FromStringAndSize(self->data + pos + HEADER, (Py_ssize_t)n);
    if (record == NULL)
        return NULL;
    self->pos = (pos + HEADER + PADDED((Py_ssize_t)n)) % cap;
    sem_post(self->free);
    return record;
}

/* take() -> bytes | None: the next record, or None if none is published. */
static PyObject *
Reader_take(End *self, PyObject *unused)
{
    if (check_open(self) < 0)
        return NULL;
    if (sem_trywait(self->items) != 0)
        Py_RETURN_NONE;
    return Reader_read(self, NULL);
}

static PyMethodDef Writer_methods[] = {
    {"put", (PyCFunction)Writer_put, METH_VARARGS, "put(payload, *more) -> bool: publish one record, or False."},
    {"freed", (PyCFunction)Writer_freed, METH_NOARGS, "freed(): a free token was taken by a wait."},
    {"pending", (PyCFunction)Writer_pending, METH_NOARGS, "pending() -> int: records published, not yet taken."},
    {"reset", (PyCFunction)End_reset, METH_NOARGS, "reset(): position 0, nothing written."},
    {"close", (PyCFunction)End_close, METH_NOARGS, "close(): let go of the mapping."},
    {NULL, NULL, 0, NULL},
};

static PyMethodDef Reader_methods[] = {
    {"take", (PyCFunction)Reader_take, METH_NOARGS, "take() -> bytes | None: the next record, or None."},
    {"read", (PyCFunction)Reader_read, METH_NOARGS, "read() -> bytes: the next record, its token taken."},
    {"reset", (PyCFunction)End_reset, METH_NOARGS, "reset(): position 0."},
    {"close", (PyCFunction)End_close, METH_NOARGS, "close(): let go of the mapping."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject Writer_type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "shmload._core._native.QueueWriter",
    .tp_basicsize = sizeof(End),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "QueueWriter(mapping, data, capacity, items, free): a control queue's writing end.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)End_init,
    .tp_dealloc = (destructor)End_dealloc,
    .tp_methods = Writer_methods,
};

static PyTypeObject Reader_type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "shmload._core._native.QueueReader",
    .tp_basicsize = sizeof(End),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "QueueReader(mapping, data, capacity, items, free): a control queue's reading end.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)End_init,
    .tp_dealloc = (destructor)End_dealloc,
    .tp_methods = Reader_methods,
};

int
add_queue_types(PyObject *module)
{
    if (PyType_Ready(&Writer_type) < 0 || PyType_Ready(&Reader_type) < 0)
        return -1;
    Py_INCREF(&Writer_type);
    if (PyModule_AddObject(module, "QueueWriter", (PyObject *)&Writer_type) < 0) {
        Py_DECREF(&Writer_type);
        return -1;
    }
    Py_INCREF(&Reader_type);
    if (PyModule_AddObject(module, "QueueReader", (PyObject *)&Reader_type) < 0) {
        Py_DECREF(&Reader_type);
        return -1;
    }
    return 0;
}

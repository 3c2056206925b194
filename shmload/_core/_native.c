/* shmload's compiled core: the default collate's per-sample checks and copies, and a
 * task's indices as the worker reads them. (The control queue's ends are _queue.c's; the
 * main process's views of a batch, _views.c's.)
 *
 * Every function here is an accelerator that may decline. It either does exactly what
 * the Python code it stands in for does (collate.py: _transpose, _fill; wire.py:
 * _int64_indices) and returns True (or its result), or it returns False (None) having
 * changed nothing the Python code will not overwrite, and the caller runs the Python
 * code, which then gives the batch or the error it always gives. So the compiled core
 * can never change a batch or an error: it accepts a subset of what Python accepts
 * (exact types only, plain dicts only, C-contiguous rows only), and declines the rest.
 * A Python exception raised while reading a sample (a MemoryError, a key whose __eq__
 * raises) propagates, as it would from Python.
 *
 * Memory safety: every copy into a slot is checked against the destination array's
 * own size before anything is written (copy_rows, fill_numbers); references are owned
 * by the lists they are put into, or released on every path out.
 *
 * Python code can run in the middle of a call (the object-leaf check, a dict key's
 * __eq__ on a hash collision, a finalizer, another thread), and may change the samples.
 * So every list read is a snapshot the function owns (as Python's zip() takes its
 * columns before looking at any child): the top-level samples are copied on entry, a
 * container's columns are all taken before any child is looked at, and copy_rows
 * copies its rows' list before it compares anything.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#define PY_ARRAY_UNIQUE_SYMBOL shmload_ARRAY_API /* (numpy's table, shared with _views.c) */
#include <numpy/arrayobject.h>
#include <string.h>

#include "_native.h"

/* Set once by setup(): the layout's node classes, and collate._an_object. */
static PyObject *Leaf_type, *Seq_type, *Map_type, *an_object;
static PyObject *s_array, *s_scalar; /* the kinds' tags, interned */

static int
same_tag(PyObject *tag, PyObject *want)
{
    if (tag == want)
        return 1;
    return PyUnicode_Check(tag) && PyUnicode_Compare(tag, want) == 0;
}

/* A tuple of non-negative ints into dims; -1 if it is not one (or is too long). */
static int
read_shape(PyObject *shape, npy_intp *dims)
{
    if (!PyTuple_Check(shape) || PyTuple_GET_SIZE(shape) > MAX_DIMS)
        return -1;
    Py_ssize_t nd = PyTuple_GET_SIZE(shape);
    for (Py_ssize_t i = 0; i < nd; i++) {
        Py_ssize_t n = PyLong_AsSsize_t(PyTuple_GET_ITEM(shape, i));
        if (n < 0) {
            PyErr_Clear();
            return -1;
        }
        dims[i] = n;
    }
    return (int)nd;
}

/* dtype equality as countOf compares: identity, then ==. -1 on an error. */
static int
same_dtype(PyObject *a, PyObject *b)
{
    if (a == b)
        return 1;
    return PyObject_RichCompareBool(a, b, Py_EQ);
}

/* The array leaf check of collate._transpose, made for every value (stricter than the
 * Python code, which leaves the shape after the first dimension to the write): exact
 * ndarray type, the kind's whole shape, the kind's dtype. 1 yes, 0 no, -1 error. */
static int
array_column_ok(PyObject *values, PyObject *kind)
{
    npy_intp dims[MAX_DIMS];
    int nd = read_shape(PyTuple_GET_ITEM(kind, 1), dims);
    if (nd < 0)
        return 0;
    PyObject *dtype = PyTuple_GET_ITEM(kind, 2);
    Py_ssize_t n = PyList_GET_SIZE(values);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *v = PyList_GET_ITEM(values, i);
        if (Py_TYPE(v) != &PyArray_Type)
            return 0;
        PyArrayObject *a = (PyArrayObject *)v;
        if (PyArray_NDIM(a) != nd)
            return 0;
        npy_intp *got = PyArray_DIMS(a);
        for (int d = 0; d < nd; d++)
            if (got[d] != dims[d])
                return 0;
        int eq = same_dtype((PyObject *)PyArray_DESCR(a), dtype);
        if (eq <= 0)
            return eq;
    }
    return 1;
}

/* A new list of item ``index`` of each sequence in ``values`` (all checked to be tuples
 * or lists of the node's length). */
static PyObject *
column_of(PyObject *values, Py_ssize_t index)
{
    Py_ssize_t n = PyList_GET_SIZE(values);
    PyObject *column = PyList_New(n);
    if (column == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *v = PyList_GET_ITEM(values, i);
        PyObject *item = PyTuple_Check(v) ? PyTuple_GET_ITEM(v, index) : PyList_GET_ITEM(v, index);
        Py_INCREF(item);
        PyList_SET_ITEM(column, i, item);
    }
    return column;
}

/* A new list of each dict's value for ``key``; NULL with no error set if one lacks it. */
static PyObject *
column_by_key(PyObject *values, PyObject *key)
{
    Py_ssize_t n = PyList_GET_SIZE(values);
    PyObject *column = PyList_New(n);
    if (column == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        /* (``values`` is a snapshot this call owns: its items stay alive whatever a
         * key's __eq__ does during the lookup) */
        PyObject *item = PyDict_GetItemWithError(PyList_GET_ITEM(values, i), key);
        if (item == NULL) { /* (a missing key: not the node's keys) */
            Py_DECREF(column);
            return NULL;
        }
        Py_INCREF(item);
        PyList_SET_ITEM(column, i, item);
    }
    return column;
}

static int transpose_node(PyObject *node, PyObject *values, PyObject *kinds, PyObject *columns);

/* Each child of a container node over its column: by position, or by key (``keys``). */
static int
transpose_children(PyObject *children, PyObject *keys, PyObject *values, PyObject *kinds, PyObject *columns)
{
    /* every column first, then the children: no child's check (which may run Python
     * code) can change what a later column holds */
    Py_ssize_t width = PyTuple_GET_SIZE(children);
    PyObject *taken = PyTuple_New(width);
    if (taken == NULL)
        return -1;
    int ok = 1;
    for (Py_ssize_t c = 0; c < width && ok > 0; c++) {
        PyObject *column = keys == NULL ? column_of(values, c) : column_by_key(values, PyTuple_GET_ITEM(keys, c));
        if (column == NULL)
            ok = PyErr_Occurred() ? -1 : 0;
        else
            PyTuple_SET_ITEM(taken, c, column);
    }
    for (Py_ssize_t c = 0; c < width && ok > 0; c++)
        ok = transpose_node(PyTuple_GET_ITEM(children, c), PyTuple_GET_ITEM(taken, c), kinds, columns);
    Py_DECREF(taken);
    return ok;
}

static int
transpose_leaf(PyObject *node, PyObject *values, PyObject *kinds, PyObject *columns)
{
    Py_ssize_t id = PyLong_AsSsize_t(PyTuple_GET_ITEM(node, 0));
    if (id < 0 || id >= PyList_GET_SIZE(kinds) || id >= PyList_GET_SIZE(columns)) {
        PyErr_Clear();
        return 0;
    }
    PyObject *kind = PyList_GET_ITEM(kinds, id);
    if (!PyTuple_Check(kind) || PyTuple_GET_SIZE(kind) < 2)
        return 0;
    PyObject *tag = PyTuple_GET_ITEM(kind, 0);
    int ok;
    if (same_tag(tag, s_array)) {
        if (PyTuple_GET_SIZE(kind) < 3)
            return 0;
        ok = array_column_ok(values, kind);
    }
    else if (same_tag(tag, s_scalar)) {
        PyObject *type = PyTuple_GET_ITEM(kind, 1);
        Py_ssize_t n = PyList_GET_SIZE(values);
        ok = 1;
        for (Py_ssize_t i = 0; i < n && ok; i++)
            ok = (PyObject *)Py_TYPE(PyList_GET_ITEM(values, i)) == type;
    }
    else { /* an object leaf: sample 0 must still be one (NOTE [ The cached plan ]) */
        PyObject *r = PyObject_CallOneArg(an_object, PyList_GET_ITEM(values, 0));
        if (r == NULL)
            return -1;
        ok = PyObject_IsTrue(r);
        Py_DECREF(r);
    }
    if (ok <= 0)
        return ok;
    Py_INCREF(values);
    if (PyList_SetItem(columns, id, values) < 0) /* steals the reference */
        return -1;
    return 1;
}

static int
transpose_seq(PyObject *node, PyObject *values, PyObject *kinds, PyObject *columns)
{
    PyObject *cls = PyTuple_GET_ITEM(node, 1);
    PyObject *children = PyTuple_GET_ITEM(node, 2);
    if (!PyTuple_Check(children))
        return 0;
    Py_ssize_t width = PyTuple_GET_SIZE(children);
    Py_ssize_t n = PyList_GET_SIZE(values);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *v = PyList_GET_ITEM(values, i);
        if ((PyObject *)Py_TYPE(v) != cls)
            return 0;
        Py_ssize_t size;
        if (PyTuple_Check(v)) {
            /* Python reads a sample's fields by iterating it (zip): a tuple subclass
             * (a namedtuple) that overrides __iter__ is left to it */
            if (Py_TYPE(v)->tp_iter != PyTuple_Type.tp_iter)
                return 0;
            size = PyTuple_GET_SIZE(v);
        }
        else if (PyList_CheckExact(v))
            size = PyList_GET_SIZE(v);
        else
            return 0; /* (no sequence of another layout reaches here; declined if one did) */
        if (size != width)
            return 0;
    }
    return transpose_children(children, NULL, values, kinds, columns);
}

static int
transpose_map(PyObject *node, PyObject *values, PyObject *kinds, PyObject *columns)
{
    PyObject *keys = PyTuple_GET_ITEM(node, 1);
    PyObject *children = PyTuple_GET_ITEM(node, 2);
    if (PyTuple_GET_ITEM(node, 0) != Py_None || !PyTuple_Check(keys) || !PyTuple_Check(children)
        || PyTuple_GET_SIZE(keys) != PyTuple_GET_SIZE(children))
        return 0; /* a mapping class other than dict: left to Python */
    Py_ssize_t width = PyTuple_GET_SIZE(keys);
    for (Py_ssize_t c = 0; c < width; c++)
        if (!PyUnicode_CheckExact(PyTuple_GET_ITEM(keys, c)))
            return 0; /* Python compares keys from the node's side, a lookup from the sample's: str only */
    Py_ssize_t n = PyList_GET_SIZE(values);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *v = PyList_GET_ITEM(values, i);
        if (!PyDict_CheckExact(v) || PyDict_GET_SIZE(v) != width)
            return 0;
    }
    return transpose_children(children, keys, values, kinds, columns);
}

static int
transpose_node(PyObject *node, PyObject *values, PyObject *kinds, PyObject *columns)
{
    if (PyList_GET_SIZE(values) == 0)
        return 0;
    PyTypeObject *t = Py_TYPE(node);
    if ((PyObject *)t == Leaf_type && PyTuple_GET_SIZE(node) >= 1)
        return transpose_leaf(node, values, kinds, columns);
    if ((PyObject *)t == Seq_type && PyTuple_GET_SIZE(node) >= 3)
        return transpose_seq(node, values, kinds, columns);
    if ((PyObject *)t == Map_type && PyTuple_GET_SIZE(node) >= 3)
        return transpose_map(node, values, kinds, columns);
    return 0;
}

static PyObject *
transpose(PyObject *self, PyObject *args)
{
    PyObject *node, *values, *kinds, *columns;
    if (!PyArg_ParseTuple(args, "OO!O!O!:transpose", &node, &PyList_Type, &values, &PyList_Type, &kinds,
                          &PyList_Type, &columns))
        return NULL;
    if (Leaf_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "shmload._core._native.setup() was not called");
        return NULL;
    }
    PyObject *snapshot = PyList_GetSlice(values, 0, PyList_GET_SIZE(values)); /* (see the top of the file) */
    if (snapshot == NULL)
        return NULL;
    int ok = transpose_node(node, snapshot, kinds, columns);
    Py_DECREF(snapshot);
    if (ok < 0)
        return NULL;
    return PyBool_FromLong(ok);
}

/* Do ``rows`` fill ``out``, seen as [len(rows), ...], exactly? Every row an exact,
 * C-contiguous ndarray of out's dtype and row shape, not overlapping out; out
 * C-contiguous and writeable, of a dtype without fields (np.concatenate copies a
 * structured dtype field by field, leaving its padding bytes as they were: a byte copy
 * would not). 1 yes, 0 no, -1 error; ``row_bytes`` set on yes. */
static int
rows_fill(PyArrayObject *out, PyObject *rows, npy_intp *row_bytes)
{
    Py_ssize_t n = PyList_GET_SIZE(rows);
    int nd = PyArray_NDIM(out);
    if (n == 0 || nd < 1 || PyArray_DIMS(out)[0] != n || !PyArray_IS_C_CONTIGUOUS(out) || !PyArray_ISWRITEABLE(out))
        return 0;
    PyArray_Descr *dtype = PyArray_DESCR(out);
    if (PyDataType_REFCHK(dtype) || PyDataType_HASFIELDS(dtype))
        return 0; /* (object dtypes never reach a slot; declined all the same) */
    npy_intp total = PyArray_NBYTES(out);
    *row_bytes = total / n;
    char *lo = PyArray_BYTES(out), *hi = lo + total;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *v = PyList_GET_ITEM(rows, i);
        if (Py_TYPE(v) != &PyArray_Type)
            return 0;
        PyArrayObject *a = (PyArrayObject *)v;
        if (PyArray_NDIM(a) != nd - 1 || !PyArray_IS_C_CONTIGUOUS(a) || PyArray_NBYTES(a) != *row_bytes)
            return 0;
        for (int d = 1; d < nd; d++)
            if (PyArray_DIMS(a)[d - 1] != PyArray_DIMS(out)[d])
                return 0;
        char *start = PyArray_BYTES(a);
        if (start < hi && start + *row_bytes > lo)
            return 0; /* a row inside the destination itself */
        int eq = same_dtype((PyObject *)PyArray_DESCR(a), (PyObject *)dtype);
        if (eq <= 0)
            return eq;
    }
    return 1;
}

/* Rows (ndarrays) into ``out`` seen as [len(rows), ...]: the bytes np.concatenate or
 * np.stack would write, or False where rows_fill() declines. */
static PyObject *
copy_rows(PyObject *self, PyObject *args)
{
    PyArrayObject *out;
    PyObject *given;
    if (!PyArg_ParseTuple(args, "O!O!:copy_rows", &PyArray_Type, &out, &PyList_Type, &given))
        return NULL;
    PyObject *rows = PyList_GetSlice(given, 0, PyList_GET_SIZE(given)); /* (see the top of the file) */
    if (rows == NULL)
        return NULL;
    npy_intp row_bytes = 0;
    int ok = rows_fill(out, rows, &row_bytes);
    if (ok > 0) {
        char *dst = PyArray_BYTES(out);
        npy_intp total = PyArray_NBYTES(out);
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(rows); i++) {
            npy_intp at = (npy_intp)i * row_bytes;
            if (at < 0 || row_bytes < 0 || at > total - row_bytes) { /* bounds: never past out's end */
                PyErr_SetString(PyExc_SystemError, "shmload._native.copy_rows: a row past the destination's end");
                ok = -1;
                break;
            }
            memcpy(dst + at, PyArray_BYTES((PyArrayObject *)PyList_GET_ITEM(rows, i)), (size_t)row_bytes);
        }
    }
    Py_DECREF(rows);
    if (ok < 0)
        return NULL;
    return PyBool_FromLong(ok);
}

/* Python numbers of one exact type into a 1-D ``out`` of int64 (int), float64 (float) or
 * bool (bool), as ``out[...] = values`` writes them. Declines on any other type or
 * dtype, and on an int outside int64 (Python's write raises OverflowError there). */
static PyObject *
fill_numbers(PyObject *self, PyObject *args)
{
    PyArrayObject *out;
    PyObject *values;
    if (!PyArg_ParseTuple(args, "O!O!:fill_numbers", &PyArray_Type, &out, &PyList_Type, &values))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(values);
    if (n == 0 || PyArray_NDIM(out) != 1 || PyArray_DIMS(out)[0] != n || !PyArray_IS_C_CONTIGUOUS(out)
        || !PyArray_ISWRITEABLE(out) || !PyArray_ISNOTSWAPPED(out) || !PyArray_ISALIGNED(out))
        Py_RETURN_FALSE;
    int type_num = PyArray_TYPE(out);
    PyTypeObject *want = type_num == NPY_INT64 ? &PyLong_Type : type_num == NPY_FLOAT64 ? &PyFloat_Type
                       : type_num == NPY_BOOL ? &PyBool_Type : NULL;
    if (want == NULL || PyArray_ITEMSIZE(out) * n != PyArray_NBYTES(out))
        Py_RETURN_FALSE;
    for (Py_ssize_t i = 0; i < n; i++)
        if (Py_TYPE(PyList_GET_ITEM(values, i)) != want)
            Py_RETURN_FALSE;
    if (type_num == NPY_INT64) {
        /* converted first, written after: a value out of range declines with nothing written */
        npy_int64 *dst = (npy_int64 *)PyArray_BYTES(out);
        for (Py_ssize_t i = 0; i < n; i++) {
            int overflow = 0;
            long long x = PyLong_AsLongLongAndOverflow(PyList_GET_ITEM(values, i), &overflow);
            if (overflow)
                Py_RETURN_FALSE;
            if (x == -1 && PyErr_Occurred())
                return NULL;
            (void)x;
        }
        for (Py_ssize_t i = 0; i < n; i++)
            dst[i] = (npy_int64)PyLong_AsLongLong(PyList_GET_ITEM(values, i));
    }
    else if (type_num == NPY_FLOAT64) {
        double *dst = (double *)PyArray_BYTES(out);
        for (Py_ssize_t i = 0; i < n; i++)
            dst[i] = PyFloat_AS_DOUBLE(PyList_GET_ITEM(values, i));
    }
    else {
        npy_bool *dst = (npy_bool *)PyArray_BYTES(out);
        for (Py_ssize_t i = 0; i < n; i++)
            dst[i] = PyList_GET_ITEM(values, i) == Py_True;
    }
    Py_RETURN_TRUE;
}

/* A task's raw int64 indices (wire.py): the list of Python ints ``np.frombuffer(raw,
 * np.int64).tolist()`` gives, and their bound (NOTE [ The bound of a task's indices ],
 * wire.py): one more than the largest of them read as uint64, None for no indices. None
 * instead of the pair (declining) for a length that is not a whole number of int64s, and
 * for a largest uint64 of 2**64 - 1, whose bound needs a Python int addition: the Python
 * code does both. Reads ``raw`` with memcpy, whatever its alignment, never past its end. */
static PyObject *
int64_indices(PyObject *self, PyObject *raw)
{
    Py_buffer view;
    if (PyObject_GetBuffer(raw, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    PyObject *out = NULL, *list = NULL, *bound = NULL;
    if (view.len % (Py_ssize_t)sizeof(npy_int64) != 0)
        goto decline;
    Py_ssize_t n = view.len / (Py_ssize_t)sizeof(npy_int64);
    const char *at = (const char *)view.buf;
    npy_uint64 top = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        npy_uint64 u;
        memcpy(&u, at + i * (Py_ssize_t)sizeof(u), sizeof(u));
        if (u > top)
            top = u;
    }
    if (n > 0 && top == NPY_MAX_UINT64)
        goto decline;
    list = PyList_New(n);
    if (list == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        npy_int64 v;
        memcpy(&v, at + i * (Py_ssize_t)sizeof(v), sizeof(v));
        PyObject *item = PyLong_FromLongLong((long long)v);
        if (item == NULL)
            goto done;
        PyList_SET_ITEM(list, i, item); /* (a partly filled list is freed whole: its NULLs are skipped) */
    }
    if (n > 0) {
        bound = PyLong_FromUnsignedLongLong((unsigned long long)top + 1);
        if (bound == NULL)
            goto done;
    }
    else {
        bound = Py_None;
        Py_INCREF(bound);
    }
    out = PyTuple_Pack(2, list, bound);
    goto done;
decline:
    out = Py_None;
    Py_INCREF(out);
done:
    Py_XDECREF(list);
    Py_XDECREF(bound);
    PyBuffer_Release(&view);
    return out;
}

static PyObject *
setup(PyObject *self, PyObject *args)
{
    PyObject *leaf, *seq, *map, *an_obj;
    if (!PyArg_ParseTuple(args, "OOOO:setup", &leaf, &seq, &map, &an_obj))
        return NULL;
    if (!PyType_Check(leaf) || !PyType_Check(seq) || !PyType_Check(map) || !PyCallable_Check(an_obj)) {
        PyErr_SetString(PyExc_TypeError, "setup(Leaf, Seq, Map, an_object): three classes and a callable");
        return NULL;
    }
    Py_INCREF(leaf);
    Py_INCREF(seq);
    Py_INCREF(map);
    Py_INCREF(an_obj);
    Py_XSETREF(Leaf_type, leaf);
    Py_XSETREF(Seq_type, seq);
    Py_XSETREF(Map_type, map);
    Py_XSETREF(an_object, an_obj);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"setup", setup, METH_VARARGS, "setup(Leaf, Seq, Map, an_object): the classes transpose() reads."},
    {"transpose", transpose, METH_VARARGS,
     "transpose(node, values, kinds, columns) -> bool: collate._transpose, or False to decline."},
    {"copy_rows", copy_rows, METH_VARARGS, "copy_rows(out, rows) -> bool: the rows' bytes into out, or False."},
    {"fill_numbers", fill_numbers, METH_VARARGS,
     "fill_numbers(out, values) -> bool: Python numbers into out, or False."},
    {"int64_indices", int64_indices, METH_O,
     "int64_indices(raw) -> (list, bound) | None: a task's raw int64 indices, or None to decline."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_native", "shmload's compiled core (see _native.c).", -1, methods,
};

PyMODINIT_FUNC
PyInit__native(void)
{
    if (_import_array() < 0) /* (an ImportError, which native.py reports: not import_array(), which prints) */
        return NULL;
    s_array = PyUnicode_InternFromString("array");
    s_scalar = PyUnicode_InternFromString("scalar");
    if (s_array == NULL || s_scalar == NULL)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && (add_queue_types(m) < 0 || add_view_functions(m) < 0))
        Py_CLEAR(m);
    return m;
}
